"""The experiments' staged pipelines: the prune experiment's greedy fractions and Pareto search with its recovery and
control, and the study as a table of resumable stages, each saved with the settings it depends on."""
