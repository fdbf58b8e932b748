"""Error types: user errors (exit code 2) versus internal failures."""

from __future__ import annotations


class AmpError(ValueError):
    """A problem with the user's input or options.

    The CLI prints it as one line and exits with code 2; nothing is written.
    It is a ValueError, as the seed API's errors for bad levels and dtypes are.
    """


class ConversionError(Exception):
    """The converter produced something it cannot stand behind (a bug or an
    unsupported construct): reported as one line with exit code 3."""
