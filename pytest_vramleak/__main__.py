"""``python -m pytest_vramleak merge ...``: see :mod:`pytest_vramleak.reporting.merge`."""

from __future__ import annotations

import sys

from .reporting.merge import main

COMMANDS = {"merge": main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: python -m pytest_vramleak merge REPORT.json ... [--json PATH] [--html PATH]", file=sys.stderr)
        sys.exit(2)
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
