"""probekit: exact logit-based bias probes for language models, and the hooks to explain them."""

__version__ = "0.1.0"
