"""A readable, fast pure-PyTorch Transformer for machine translation."""

__version__ = "0.1.0"
