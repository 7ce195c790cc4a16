"""Allow ``python -m trainyard``: a pod's process ends without the interpreter's teardown."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from trainyard.cli import finish, is_pod_command, main

    code = main()
    if is_pod_command(sys.argv[1] if len(sys.argv) > 1 else ""):
        finish(code)
    sys.exit(code)
