"""CPU serving: a TF-Serving-compatible REST server and the deploy step.

* :mod:`trainyard.serving.server`: aiohttp server and ``trainyard serve``.
* :mod:`trainyard.serving.versions`: version discovery, loading, warm-up, hot swap, batching.
* :mod:`trainyard.serving.schema`: request checks against the contract's feature spec.
* :mod:`trainyard.serving.deploy`: publish, wait, smoke-test, roll back; local server process.
* :mod:`trainyard.serving.client`: a small stdlib HTTP client.

Import the submodule you need; this package imports nothing heavy.
"""

from __future__ import annotations
