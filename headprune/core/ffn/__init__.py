"""The ffn kind: its sites, gates, removal and records."""
