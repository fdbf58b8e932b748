"""``python -m amp_convert`` runs the command line."""

import sys

from .cli import main

sys.exit(main())  # (not cli.command: this module may run inside a host process, e.g. runpy or cProfile)
