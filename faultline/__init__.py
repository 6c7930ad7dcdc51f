"""faultline: fault diagnosis for large GPU training clusters."""

__version__ = "0.1.0"
