"""memd: a local memory service for AI agents."""

__all__ = ["__version__"]

__version__ = "0.1.0"
