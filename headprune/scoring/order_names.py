"""The names of the pruning orders, for the settings' schema (headprune.sources.orders.ORDERS checks it has exactly these)."""

ORDER_NAMES = ("importance", "fisher", "ablation", "entropy", "random", "duo", "retrieval", "obs", "obs_fisher")
