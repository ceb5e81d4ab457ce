"""``python -m sgdsl`` is the ``sgdsl`` command."""
import sys

from sgdsl.cli import main

sys.exit(main())
