"""specbench: a reproducible benchmark harness for speculative decoding."""

__version__ = "0.1.0"
