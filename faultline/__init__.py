"""faultline: fault diagnosis for large GPU training clusters."""

from importlib.metadata import PackageNotFoundError, version

# One source of truth, pyproject.toml, as the agent and the API read it too.
try:
    __version__ = version("faultline")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "dev"
