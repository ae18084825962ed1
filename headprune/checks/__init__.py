"""The checks an experiment runs before work: shared ones, prune, speed and streaming settings, the checkpoint lists of dynamics."""
