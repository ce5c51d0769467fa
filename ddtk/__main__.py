"""``python -m ddtk`` runs the ``ddtk`` command."""

import sys

from ddtk.cli import main

sys.exit(main())
