"""Pruning in the prune experiment: the greedy fractions and the Pareto search for speed with its recovery and control."""
