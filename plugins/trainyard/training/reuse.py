"""Whether a run trains, or reuses the version trained on the same inputs.

A run's training is fingerprinted (:func:`training_fingerprint`): the snapshot ids of its
window, the contract, the effective training config with its seed, the code, the image,
TensorFlow and the hardware class. A version registered with the same fingerprint would
come out again (training is reproducible: ``docs/reproducibility.md``), so the run reuses
it instead: 0 s of training, and the gate still decides. ``force_retrain`` trains all
the same. Both runners ask :func:`plan_training` before anything trains: ``trainyard
run`` and the ``train`` step before the launcher starts workers, the Airflow ``train``
task before the kubernetes runner creates a Service or a Job.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainyard.fingerprint import (
    Fingerprint,
    code_identity,
    contract_digest,
    fingerprint,
    listed,
    package_version,
)

if TYPE_CHECKING:
    from trainyard.config import PipelineConfig, TrainingConfig
    from trainyard.registry import Registry

log = logging.getLogger("trainyard.training")

NOT_THE_MODEL = frozenset({"priority", "start_deadline_s", "attempt_timeout_s", "max_attempts"})
"""Training settings that change where and how long a run may take, not what it learns.

``window`` is left out too: the snapshot ids it resolved to are an input of their own.
"""

INPUT_NAMES = {
    "snapshots": "snapshots",
    "contract": "contract",
    "config": "config",
    "code": "code",
    "image": "image",
    "tensorflow": "TensorFlow",
    "hardware": "hardware",
}
"""How a reuse or retrain sentence names each input."""


def training_fingerprint(
    cfg: PipelineConfig,
    training: TrainingConfig,
    window: Sequence[str],
    trainer_image: str | None = None,
) -> Fingerprint:
    """The fingerprint of a run's training: what its model depends on.

    Args:
        cfg: The pipeline.
        training: The run's effective training config (trigger-form overrides applied).
        window: The snapshot ids it trains on, oldest first (their order is the data's).
        trainer_image: The image a cluster's training Jobs run (the kubernetes runner's):
            its TensorFlow, on the hardware the config asks for. None: the workers run
            here, with this environment's TensorFlow on this machine.

    Returns:
        Its fingerprint (kind ``train``).
    """
    from trainyard.contracts import load_contract
    from trainyard.settings import get_settings

    contract = load_contract(cfg.dataset)
    config = {
        k: v
        for k, v in training.model_dump(mode="json").items()
        if k not in NOT_THE_MODEL and k != "window"
    }
    settings = get_settings()
    if settings.allreduce_pack_bytes:  # packing regroups the gradients the ring sums
        config["allreduce_pack_bytes"] = settings.allreduce_pack_bytes
    if trainer_image is None:
        image = settings.image
        tf_version, hardware = _tensorflow_version(), _local_hardware()
    else:
        image, tf_version = trainer_image, None
        hardware = f"gpu x{training.gpus_per_worker}" if training.gpus_per_worker else "cpu"
    return fingerprint(
        "train",
        {
            "snapshots": list(window),
            "contract": {"version": contract.version, "digest": contract_digest(contract)},
            "config": config,
            "code": code_identity(),
            "image": image,
            "tensorflow": tf_version,
            "hardware": hardware,
        },
    )


def _local_hardware() -> str:
    """This machine's class for training: CPUs and how many, or a GPU.

    Thread pools follow the CPU count; a GPU counts where NVIDIA's driver lists one (the
    workers' TensorFlow would use it).
    """
    import os
    from pathlib import Path

    gpus = Path("/proc/driver/nvidia/gpus")
    kind = "gpu" if gpus.is_dir() and any(gpus.iterdir()) else "cpu"
    return f"{kind} ({os.cpu_count()} cpus)"


def _tensorflow_version() -> str | None:
    return package_version("tensorflow", "tensorflow-cpu", "tensorflow-macos")


def trained_with(registry: Registry, fp: Fingerprint) -> int | None:
    """The version trained on ``fp``'s inputs: the champion if it was, else the newest.

    Versions whose metadata does not read are passed over (``models list`` names them).
    """
    from trainyard.errors import TrainyardError

    try:
        champion = registry.champion()
    except TrainyardError:
        champion = None
    versions = registry.list_versions()
    if champion in versions:
        versions = [*(v for v in versions if v != champion), champion]
    for version in reversed(versions):
        try:
            kept = Fingerprint.from_dict(registry.metadata(version).get("fingerprint"))
        except TrainyardError:
            continue
        if fp.same_as(kept):
            return version
    return None


def _reference(registry: Registry) -> tuple[int | None, Fingerprint | None]:
    """The version a retrain is compared with, to say what changed.

    The champion, else the newest version.
    """
    from trainyard.errors import TrainyardError

    try:
        version = registry.champion()
    except TrainyardError:
        version = None
    if version is None:
        versions = registry.list_versions()
        version = versions[-1] if versions else None
    if version is None:
        return None, None
    try:
        return version, Fingerprint.from_dict(registry.metadata(version).get("fingerprint"))
    except TrainyardError:
        return version, None


@dataclass(frozen=True)
class TrainingPlan:
    """What a run's training does: train, or reuse a version; and why, in one line.

    Attributes:
        training: The run's effective training config.
        fingerprint: Its fingerprint (kept with the version it registers).
        reuse: The version trained on the same inputs, reused instead of training; None
            when the run trains.
        line: One sentence for the log and the run's summary (``unchanged since version 7
            (same 5 snapshots, config, code): reused, 0 s``).
    """

    training: TrainingConfig
    fingerprint: Fingerprint
    reuse: int | None
    line: str

    def result(self) -> dict[str, Any]:
        """The ``plan`` step's result: ``training``, ``fingerprint``, ``reused``, ``decision``."""
        return {
            "training": self.training.model_dump(mode="json"),
            "fingerprint": self.fingerprint.to_dict(),
            "reused": self.reuse,
            "decision": self.line,
        }


def plan_training(
    cfg: PipelineConfig,
    training: TrainingConfig,
    window: Sequence[str],
    force_retrain: bool = False,
    trainer_image: str | None = None,
) -> TrainingPlan:
    """Whether this run trains or reuses the version trained on the same inputs.

    Args:
        cfg: The pipeline.
        training: The run's effective training config.
        window: The snapshot ids it would train on.
        force_retrain: Train even if a version was trained on the same inputs.
        trainer_image: See :func:`training_fingerprint`.

    Returns:
        The plan, with its reason.
    """
    from trainyard.registry import Registry
    from trainyard.settings import get_settings

    registry = Registry(get_settings().models_root, cfg.name)
    fp = training_fingerprint(cfg, training, window, trainer_image)
    n = len(fp.inputs["snapshots"])
    same = f"same {n} snapshots, config, code" if n != 1 else "same snapshot, config, code"
    found = trained_with(registry, fp)
    if found is not None and not force_retrain:
        line = f"unchanged since version {found} ({same}): reused, 0 s"
        return TrainingPlan(training, fp, found, line)
    if found is not None:
        line = f"retrains on purpose (force_retrain): version {found} was trained on the {same}"
        return TrainingPlan(training, fp, None, line)
    version, kept = _reference(registry)
    if version is None:
        line = "trains: no version yet"
    elif kept is None:
        line = f"trains: version {version} was registered without a fingerprint of its inputs"
    else:
        changed = [INPUT_NAMES.get(k, k) for k in fp.changed(kept)]
        what = listed(changed) or "its inputs"
        line = f"trains: {what} changed since version {version}"
    return TrainingPlan(training, fp, None, line)
