"""The block kind: its sites, gates, removal and records."""
