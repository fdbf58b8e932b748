"""``python -m amp_convert`` runs the command line."""

from .cli import command

command()
