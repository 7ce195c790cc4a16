"""Allow ``python -m trainyard``."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from trainyard.cli import main

    sys.exit(main())
