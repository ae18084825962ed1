"""The layer kind: its sites, gates, removal and records."""
