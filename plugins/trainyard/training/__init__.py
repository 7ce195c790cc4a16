"""Distributed training from a step: the local launcher (``run_training``)."""

from __future__ import annotations

from trainyard.training.launcher import TrainResult, run_training

__all__ = ["TrainResult", "run_training"]
