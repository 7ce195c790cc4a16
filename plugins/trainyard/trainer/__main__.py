"""``python -m trainyard.trainer``: one training worker (entrypoint of ``images/trainer``)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from trainyard.trainer.worker import main

if __name__ == "__main__":
    sys.exit(main())
