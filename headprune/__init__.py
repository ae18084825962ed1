"""headprune: study and prune the attention heads of Transformers."""
__version__ = "0.1.0"
