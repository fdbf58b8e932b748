"""The package version (a module of its own: every layer may read it)."""

__version__ = "0.1.0"
