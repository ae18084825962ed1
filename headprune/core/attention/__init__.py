"""The attention kind: its sites, gates, removal and records."""
