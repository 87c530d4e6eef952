"""``python -m robustest`` runs the command-line interface."""

import sys

from robustest._entry import main

sys.exit(main())
