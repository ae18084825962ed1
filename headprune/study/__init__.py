"""The study as a table of resumable stages, each saved with the settings it depends on."""
