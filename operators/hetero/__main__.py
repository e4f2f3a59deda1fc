"""``python -m operators.hetero [kopf run options]``: run the operator (one replica, no peering)."""

from __future__ import annotations

import sys

from kopf.cli import main

if __name__ == "__main__":
    sys.argv = ["kopf", "run", "--standalone", "-m", "operators.hetero.handlers", *sys.argv[1:]]
    main()
