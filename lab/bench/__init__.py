"""Benchmarks: `faultline bench ...`."""
