"""Distributed training: the run spec, the local launcher, and the worker that runs in pods.

* :mod:`trainyard.training.spec`: the launcher ↔ worker contract (command, args, env).
* :mod:`trainyard.training.launcher`: runs rendered training Jobs as local processes and
  owns their liveness.
* :mod:`trainyard.training.worker`: the worker program (``python -m trainyard worker``).

Importing this package imports nothing heavy.
"""

from __future__ import annotations
