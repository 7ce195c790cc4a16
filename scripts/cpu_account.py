"""Where the CPU of a test run goes, by kind of Python process (issue 35's evidence).

``make test`` is bound by CPU work on two cores, not by waiting, so what counts is what each
process costs. This records, for every Python process of the venv that exits while
``TRAINYARD_CPU_ACCOUNT`` names a file, its own CPU time (``getrusage``, all threads) and
its command line; forks count on their own. A process killed by a signal is not counted.

Usage::

    python scripts/cpu_account.py on          # a .pth in the venv loads the hook
    TRAINYARD_CPU_ACCOUNT=/tmp/cpu.jsonl pytest -n 2
    python scripts/cpu_account.py report /tmp/cpu.jsonl
    python scripts/cpu_account.py off
"""

from __future__ import annotations

import json
import os
import sys

ENV = "TRAINYARD_CPU_ACCOUNT"
PTH = "_trainyard_cpu_account.pth"


def _hook(path: str) -> None:
    """Log this process's CPU time to ``path`` when it exits (``os._exit`` included).

    Once per process: site may read the ``.pth`` twice (seen in this venv), and a second
    hook would log every process twice.
    """
    if getattr(sys, "_trainyard_cpu_account", False):
        return
    sys._trainyard_cpu_account = True  # type: ignore[attr-defined]
    import atexit
    import resource
    import time

    start_pid, start = os.getpid(), time.time()
    logged: list[int] = []

    def log() -> None:
        if os.getpid() in logged:
            return
        logged.append(os.getpid())
        use = resource.getrusage(resource.RUSAGE_SELF)
        record = {
            "argv": " ".join(sys.argv)[:300],
            "fork": os.getpid() != start_pid,
            "cpu": round(use.ru_utime + use.ru_stime, 3),
            "wall": round(time.time() - start, 3),
        }
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:
            pass

    exit_now = os._exit

    def _exit(code: int) -> None:
        log()
        exit_now(code)

    atexit.register(log)
    os._exit = _exit  # type: ignore[assignment]


def kind(record: dict) -> str:
    """A process's kind: ``airflow dags test``, ``trainyard worker``, ``pytest``..."""
    words = record["argv"].split()
    first = words[0] if words else "?"
    if first.endswith("airflow"):
        name = "airflow " + " ".join(words[1:3])
    elif first.endswith("trainyard/__main__.py") and len(words) > 1:
        name = "trainyard " + words[1]
    elif "pytest" in first or "xdist" in record["argv"]:
        name = "pytest"
    else:
        name = os.path.basename(first)
    return name + (" (fork)" if record["fork"] else "")


def report(path: str) -> str:
    """CPU seconds by kind of process, most first: total, count, each."""
    by: dict[str, list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            by.setdefault(kind(record), []).append(record["cpu"])
    total = sum(sum(v) for v in by.values())
    lines = [f"{'CPU s':>8} {'share':>6} {'count':>6} {'each':>6}  process"]
    for name, cpus in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        s = sum(cpus)
        lines.append(f"{s:8.1f} {s / total:6.1%} {len(cpus):6d} {s / len(cpus):6.2f}  {name}")
    lines.append(f"{total:8.1f} {'':6} {sum(len(v) for v in by.values()):6d}         in all")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``on``, ``off`` or ``report FILE`` (see the module doc)."""
    import site

    pth = os.path.join(site.getsitepackages()[0], PTH)
    if argv[:1] == ["on"]:
        me = os.path.abspath(__file__)
        line = (
            f"import os; os.environ.get({ENV!r}) and __import__('runpy').run_path({me!r}, "
            f"run_name='cpu_account_hook')\n"
        )
        with open(pth, "w", encoding="utf-8") as f:
            f.write(line)
        print(f"on: {pth}; set {ENV}=<file> in the environment of what you measure")
    elif argv[:1] == ["off"]:
        if os.path.exists(pth):
            os.remove(pth)
        print("off")
    elif argv[:1] == ["report"] and len(argv) == 2:
        print(report(argv[1]))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "cpu_account_hook":
    _hook(os.environ[ENV])
elif __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
