"""``python -m emgmm``: the ``emgmm`` command line."""

import sys

from .cli import main

sys.exit(main())
