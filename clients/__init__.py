"""Each export of a pruned model checked in the client people run it in, without headprune (``make test-clients``)."""
