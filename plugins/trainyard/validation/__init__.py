"""Validation of snapshots against their data contracts (GX suites run in batches).

``validate(pipeline, snapshot_id)`` is the step; ``validate_snapshot`` does the work on
any snapshot folder; ``build_suite`` is the contract → GX translator.
"""

from __future__ import annotations

from trainyard.validation.runner import ValidatorCrashed
from trainyard.validation.step import ValidationResult, validate, validate_snapshot
from trainyard.validation.suite import build_suite

__all__ = ["ValidationResult", "ValidatorCrashed", "build_suite", "validate", "validate_snapshot"]
