"""The prune experiment's stages: the greedy fractions and the Pareto search for speed with its recovery and control."""
