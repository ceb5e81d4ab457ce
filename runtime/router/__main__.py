"""``python -m sgdsl.runtime.router``: same as ``sgdsl router``."""
from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
