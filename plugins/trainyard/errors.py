"""Domain exceptions: each names what failed and why, so a task log reads as a diagnosis."""

from __future__ import annotations

INTERRUPTED = "interrupted by the user"
"""What a run stopped by Ctrl-C (SIGINT) says, wherever it is told: never retried."""


class TrainyardError(Exception):
    """Base class of every error trainyard raises on purpose."""


class Interrupted(TrainyardError):
    """The user stopped the run (Ctrl-C on ``make run``): nothing more starts, no retry."""


class ConfigError(TrainyardError):
    """A pipeline config, cluster profile or contract file is invalid (names file and field)."""


class ContractError(ConfigError):
    """A data contract is invalid or cannot be compiled."""


class StagingError(TrainyardError):
    """A source cannot be staged (missing, empty, corrupt, changed while read)."""


class SourceMissing(StagingError):
    """The source (the interval's partition) does not exist (``source.when_missing`` decides)."""


class SourceInvalid(StagingError):
    """The source's content breaks the contract: no retry fixes it.

    A missing or undeclared column, a value that does not cast, a malformed row or file.
    """


class SourceUnreadable(StagingError):
    """The storage refused to read the source (credentials, a bad name, access denied).

    No retry fixes it: the source URL or its connection must change.
    """


class StepSkipped(TrainyardError):
    """A step has nothing to do for this run: the task and what depends on it skip.

    A missing partition with ``source.when_missing: skip``; the message is the reason.
    """


class SnapshotError(TrainyardError):
    """A snapshot is missing, incomplete or does not match its manifest."""


class ValidationFailed(TrainyardError):
    """A snapshot broke a blocking rule of its data contract (the data is invalid)."""


class DaysFailed(TrainyardError):
    """Days of a ``trainyard run`` range failed on their data, and nothing trained."""


class TrainingError(TrainyardError):
    """Distributed training failed after all attempts (or deterministically, e.g. NaN loss)."""


class TrainingTerminated(TrainingError):
    """Training was stopped by SIGTERM (its task killed or timed out); never retried."""

    retryable = False


class EvaluationError(TrainyardError):
    """A model could not be evaluated (bad inputs, outputs or labels)."""


class GateRejected(TrainyardError):
    """The evaluation gate rejected the candidate model."""


class RegistryError(TrainyardError):
    """The model registry is missing a version or its champion pointer is unreadable."""


class RegistryRefused(RegistryError):
    """The registry refuses what was asked: no retry changes the answer.

    No such version, a gate's rejection, no champion to roll back.
    """


class DeployError(TrainyardError):
    """A deployment failed its smoke test or never became available (after rollback)."""


class ApprovalMissing(DeployError):
    """A version that needs a person's approval has none (yet, or it was rejected)."""


class ServingError(TrainyardError):
    """The model server cannot start (its port is taken, its base path unusable)."""
