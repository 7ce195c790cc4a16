"""Evaluation of a candidate and the promotion gate.

Metrics on the holdout (:mod:`.metrics`), the gate (:mod:`.gate`), and the ``evaluate``
step's wiring to the registry and the snapshots (:mod:`.step`).
"""
