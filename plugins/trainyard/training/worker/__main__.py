"""``python -m trainyard.training.worker``: one training worker (`images/trainer`)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from trainyard.training.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
