"""The hidden kind: its sites, gates, removal and records."""
