"""``python -m fleetclean`` is the ``fleetclean`` command."""

import sys

from fleetclean.cli import main

sys.exit(main())
