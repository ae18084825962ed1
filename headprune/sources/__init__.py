"""Where an experiment's scores, masks and pruned models come from: the pruning orders, a score file, a mask file, a saved point model."""
