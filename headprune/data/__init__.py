"""Datamodules and built-in synthetic tasks."""
