"""``python -m robustest`` runs the command-line interface."""

import sys

from robustest.cli import main

sys.exit(main())
