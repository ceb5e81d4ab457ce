"""``python -m sgdsl.runtime.server``: one server (``sgdsl serve`` without ``--dp-size``)."""
from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
