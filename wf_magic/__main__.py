"""``python -m wf_magic``: the ``wf`` command, exiting with its code."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
