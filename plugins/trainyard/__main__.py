"""Allow ``python -m trainyard``."""

from __future__ import annotations

import sys

from trainyard.cli import main

sys.exit(main())
