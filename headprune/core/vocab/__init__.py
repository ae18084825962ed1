"""The vocab kind: its sites, gates, removal and records."""
