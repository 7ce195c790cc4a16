"""The training worker: one process of a distributed run (``python -m trainyard worker``).

Role from ``TF_CONFIG`` (or derived from the Indexed Job environment). Exit codes tell the
launcher what happened, as every trainyard command does: 0 done, 3 (:data:`EXIT_BAD_INPUT`,
:data:`EXIT_NAN`) a failure no retry fixes: bad config, contract or snapshot, or a loss that
became NaN (that line carries :data:`NAN_MARKER`), :data:`EXIT_ORPHAN` the launcher died,
anything else a crash (retry the attempt).

Test-only fault injection (``TRAINYARD_FAULT``, comma-separated
``<kind>:<epoch>:<task type>:<index>[:<attempt>]``, attempt defaults to 1):
``exit_after_epoch`` exits with code 17 after that many completed epochs;
``kill_mid_epoch`` SIGKILLs itself at the third batch of that epoch (0-based);
``hang_before_ready`` never constructs the strategy (start-deadline test).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import TrainyardError
from trainyard.fsutil import atomic_write_json, fsync_tree
from trainyard.progress import human_seconds, progress_interval
from trainyard.training import spec
from trainyard.training.spec import TENSORBOARD_DIR
from trainyard.training.worker.tf_config import Role, resolve_tf_config, role_of

READY_MARKER = "TRAINYARD_WORKER_READY"
NAN_MARKER = "TRAINYARD_LOSS_NAN"
EXIT_BAD_INPUT = 3
"""A failure no retry fixes (the CLI's exit code 3; 4 means "nothing to do")."""
EXIT_NAN = EXIT_BAD_INPUT
EXIT_ORPHAN = 5
EXIT_FAULT = 17
HISTORY_STATE = "trainyard_history.json"
_PR_SET_PDEATHSIG = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the worker command line (see ``--help``)."""
    p = argparse.ArgumentParser(
        prog="python -m trainyard worker", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--snapshot-dir",
        type=Path,
        required=True,
        action="append",
        dest="snapshot_dirs",
        help="a snapshot to train on; repeated for every snapshot of the training window",
    )
    p.add_argument("--contract", type=Path, required=True, help="data contract YAML")
    p.add_argument("--model", required=True, help="model registry name (small_cnn, mlp)")
    p.add_argument(
        "--strategy", required=True, choices=["multi_worker_mirrored", "parameter_server"]
    )
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="global batch size")
    p.add_argument("--learning-rate", type=float, required=True)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache", default=None, help="'memory' or a local directory for tf.data cache files"
    )
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "steps_per_execution"):
        if getattr(args, name) < (0 if name == "epochs" else 1):
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def install_parent_guard(parent_pid: int | None) -> None:
    """Die with the launcher: ``PR_SET_PDEATHSIG`` plus a parent-pid watchdog thread.

    Args:
        parent_pid: The launcher's pid (``TRAINYARD_PARENT_PID``); None disables the guard
            (a pod, where Kubernetes owns the process).
    """
    if parent_pid is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHAN)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(EXIT_ORPHAN)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def check_loopback_guard(want: str | None) -> None:
    """Refuse to start when this process's wildcard binds would not land on ``want``.

    The local launcher preloads its loopback library and sets
    :data:`~trainyard.training.spec.ENV_BIND`; a library the dynamic loader could not load
    is only a warning on stderr, so one wildcard bind here proves it took effect.

    Args:
        want: The address wildcard binds must become (None: not asked, e.g. in a pod).

    Raises:
        TrainyardError: On Linux, when a bind to ``0.0.0.0`` lands anywhere else.
    """
    if not want or not sys.platform.startswith("linux"):
        return
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", 0))
            got = probe.getsockname()[0]
        except OSError as e:
            got = f"an error ({e})"
    if got != want:
        raise TrainyardError(
            f"{spec.ENV_BIND}={want}, but a bind to 0.0.0.0 gives {got}: the loopback library "
            "is not preloaded (LD_PRELOAD), so the gRPC server would listen on every interface"
        )


@dataclass(frozen=True)
class Fault:
    """A test-only injected fault for this process."""

    kind: str
    epoch: int


def active_fault(spec: str | None, role: Role, attempt: int) -> Fault | None:
    """The fault of ``TRAINYARD_FAULT`` that targets this task and attempt, if any."""
    for item in (spec or "").split(","):
        parts = item.strip().split(":")
        if len(parts) not in (4, 5):
            continue
        kind, epoch, ttype, index = parts[:4]
        want_attempt = int(parts[4]) if len(parts) == 5 else 1
        if ttype == role.task_type and int(index) == role.index and want_attempt == attempt:
            return Fault(kind, int(epoch))
    return None


def _say(role: Role, msg: str) -> None:
    print(f"[{role.name}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run one training task; returns the process exit code."""
    args = parse_args(argv)
    parent = os.environ.get(spec.ENV_PARENT_PID)
    install_parent_guard(int(parent) if parent else None)
    try:
        check_loopback_guard(os.environ.get(spec.ENV_BIND))
        cfg = resolve_tf_config(os.environ)
        role = role_of(cfg)
        if args.strategy == "multi_worker_mirrored" and role.task_type == "ps":
            raise TrainyardError("multi_worker_mirrored has no parameter servers; got task type ps")
        from trainyard.contracts import parse_contract

        contract = parse_contract(Path(args.contract))
    except TrainyardError as e:
        print(f"trainyard.training.worker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    if args.strategy == "parameter_server":
        cfg.setdefault("rpc_layer", "grpc")
    os.environ["TF_CONFIG"] = json.dumps(cfg)
    attempt = int(os.environ.get(spec.ENV_ATTEMPT, "1"))
    fault = active_fault(os.environ.get(spec.ENV_FAULT), role, attempt)
    if fault and fault.kind == "hang_before_ready":
        _say(role, "fault injected: hanging before the strategy is constructed")
        while True:
            time.sleep(3600)
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    try:
        return _run(args, cfg, role, contract, fault, attempt)
    except TrainyardError as e:
        print(
            f"trainyard.training.worker [{role.name}]: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_BAD_INPUT


def _run(
    args: argparse.Namespace,
    cfg: dict[str, Any],
    role: Role,
    contract: Any,
    fault: Fault | None,
    attempt: int,
) -> int:
    import tensorflow as tf

    if args.strategy == "parameter_server" and role.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cfg["cluster"]),
            job_name=role.task_type,
            task_index=role.index,
            protocol="grpc",
            start=True,
        )
        _say(role, f"{READY_MARKER} parameter-server cluster task serving at {server.target}")
        server.join()
        return 0

    import tf_keras as keras

    from trainyard.contracts import feature_spec
    from trainyard.training.worker.architectures import ModelSpec, build_model
    from trainyard.training.worker.input import SnapshotInput
    from trainyard.training.worker.transform import TRANSFORM_FILE
    from trainyard.volumes import check_snapshot

    # every source of randomness seeded, every op deterministic: the same inputs train the
    # same weights on the same hardware (docs/reproducibility.md)
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    if args.strategy == "multi_worker_mirrored":
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options()
        )
    else:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
    _say(role, f"{READY_MARKER} strategy={args.strategy} replicas={strategy.num_replicas_in_sync}")

    manifests = [check_snapshot(d) for d in args.snapshot_dirs]
    inp = SnapshotInput(
        args.snapshot_dirs,
        contract,
        "train",
        in_graph=args.strategy == "parameter_server",
        cache=args.cache,
    )
    if inp.spec.num_examples == 0:
        raise TrainyardError(
            f"{', '.join(map(str, args.snapshot_dirs))}: the training split is empty"
        )
    global_batch = args.batch_size
    steps_per_epoch = max(inp.spec.num_examples // global_batch, 1)
    if args.strategy == "multi_worker_mirrored" and global_batch % strategy.num_replicas_in_sync:
        raise TrainyardError(
            f"--batch-size {global_batch} is not divisible by "
            f"{strategy.num_replicas_in_sync} replicas"
        )

    first_epoch = resumed_epoch(args.checkpoint_dir / "backup")
    if first_epoch:
        _say(role, f"resuming at epoch {first_epoch + 1}, with the batches it would have had")

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        per_pipeline = (
            ctx.get_per_replica_batch_size(global_batch)
            if args.strategy == "multi_worker_mirrored"
            else global_batch
        )
        return inp.epochs(
            per_pipeline,
            steps_per_epoch,
            ctx.num_input_pipelines,
            ctx.input_pipeline_id,
            seed=args.seed + ctx.input_pipeline_id,
            first_epoch=first_epoch,
        )

    inputs = feature_spec(contract)
    transform = inp.spec.transform
    spec = ModelSpec(
        inputs=inputs,
        outputs=inp.spec.outputs,
        seed=args.seed,
        target_stats=inp.spec.target_stats,
        transform=transform,
    )
    with strategy.scope():
        model = build_model(args.model, spec)
        loss, metrics = _objective(contract, inp.spec.target_stats)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss=loss,
            metrics=metrics,
            steps_per_execution=min(args.steps_per_execution, steps_per_epoch),
        )

    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    history_cls, fault_cls, progress_cls = _callback_classes()
    recorder = history_cls(args.checkpoint_dir / HISTORY_STATE, role.is_chief, attempt)
    callbacks: list[Any] = [
        keras.callbacks.BackupAndRestore(backup_dir=str(args.checkpoint_dir / "backup")),
        recorder,
        # a parameter-server step's loss is a remote value: reading it would wait for it
        progress_cls(
            role,
            args.epochs,
            steps_per_epoch,
            strategy.num_replicas_in_sync if args.strategy != "parameter_server" else 0,
        ),
    ]
    if args.strategy == "multi_worker_mirrored":  # it breaks on PS RemoteValues
        callbacks.insert(1, keras.callbacks.TerminateOnNaN())
    if role.is_chief:  # epoch logs are already global; others' events would be duplicates
        callbacks.append(
            keras.callbacks.TensorBoard(
                log_dir=str(args.output_dir / TENSORBOARD_DIR), write_graph=False, profile_batch=0
            )
        )
    if fault is not None:
        callbacks.append(fault_cls(fault, role))
    _say(
        role,
        f"training {args.model} on {inp.spec.num_examples} examples, {steps_per_epoch} steps/epoch",
    )
    t0 = time.monotonic()
    if args.epochs:
        model.fit(
            keras.utils.experimental.DatasetCreator(dataset_fn),
            epochs=args.epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            verbose=2,
        )
    else:
        _say(role, "0 epochs: exporting the untrained model (a baseline candidate)")
    seconds = time.monotonic() - t0
    if recorder.nan or model.stop_training:
        _say(role, f"{NAN_MARKER} loss became NaN or inf; stopping without exporting a model")
        return EXIT_NAN

    plain = build_model(args.model, spec)
    plain.set_weights(model.get_weights())
    if not role.is_chief:
        return 0
    found = next((m.extra.get("classes") for m in reversed(manifests) if m.extra), None)
    class_names = None if contract.is_regression else contract.class_names(found)
    _export(plain, inputs, args.output_dir / "model", class_names)
    state = recorder.state
    epochs = state["epochs"]
    last = epochs[-1] if epochs else {}
    atomic_write_json(
        args.output_dir / "metrics.json",
        {
            "task": contract.roles.task,
            "loss": last.get("loss"),
            **{
                k: last.get(k)
                for k in (("rmse", "mae") if contract.is_regression else ("accuracy",))
            },
            "class_names": class_names,
            "epochs": len(epochs),
            "epochs_this_attempt": recorder.epochs_run,
            "examples_per_s": recorder.epochs_run * steps_per_epoch * global_batch / seconds
            if seconds
            else None,
            "train_examples": inp.spec.num_examples,
            "global_batch_size": global_batch,
            "steps_per_epoch": steps_per_epoch,
            "strategy": args.strategy,
            "workers": role.num_workers,
            "model": args.model,
            "seconds": seconds,
        },
    )
    atomic_write_json(args.output_dir / "history.json", state)
    atomic_write_json(
        args.output_dir / "inputs.json",
        {
            **_inputs(manifests, inp.spec.num_examples),
            "determinism": determinism(args.strategy, bool(tf.config.list_physical_devices("GPU"))),
        },
    )
    if transform is not None:  # the statistics the model was built with (its lineage)
        atomic_write_json(args.output_dir / TRANSFORM_FILE, transform)
    _say(role, f"exported {args.output_dir / 'model'}")
    return 0


def _inputs(manifests: list[Any], train_examples: int) -> dict[str, Any]:
    """What the run read: every snapshot of its window (lineage for ``register``)."""
    snapshots = [
        {
            "dataset": m.dataset,
            "snapshot_id": m.snapshot_id,
            "interval": [m.interval.get("start"), m.interval.get("end")] if m.interval else None,
            "created_at": m.created_at,
            "rows": m.rows,
        }
        for m in manifests
    ]
    return {
        "snapshots": snapshots,
        "rows": sum(s["rows"] for s in snapshots),
        "train_examples": train_examples,
    }


def communication_options() -> Any:
    """All-reduce options: NCCL on GPUs, else the ring.

    ``TRAINYARD_ALLREDUCE_PACK_BYTES`` packs gradients. The implementation is named, not
    left to ``AUTO``: which one runs (and so the order in which the workers' gradients are
    summed) must not depend on what TensorFlow picks.
    """
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    gpus = tf.config.list_physical_devices("GPU")
    from trainyard.settings import get_settings

    pack = get_settings().allreduce_pack_bytes
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=pack, implementation=impl.NCCL if gpus else impl.RING
    )


def resumed_epoch(backup_dir: Path) -> int:
    """The epoch a run resumes at: the one after the last ``BackupAndRestore`` saved (or 0).

    Read before training starts, so that the input pipeline starts at that epoch's batches
    (``SnapshotInput.epochs``): a resumed run sees the data an uninterrupted one would.
    """
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(backup_dir / "chief"))
    if not latest:
        return 0
    try:
        reader = tf.train.load_checkpoint(latest)
        key = next(k for k in reader.get_variable_to_shape_map() if "ckpt_saved_epoch" in k)
        saved = int(reader.get_tensor(key))
    except (StopIteration, ValueError, tf.errors.OpError):
        return 0
    return saved + 1 if saved >= 0 else 0


def determinism(strategy: str, gpus: bool) -> dict[str, Any]:
    """Whether this run's weights follow from its inputs alone, and if not, why (metadata).

    Seeds are set and TensorFlow's op determinism is on in every run; what it cannot
    promise is said (``docs/reproducibility.md``).
    """
    why = []
    if strategy == "parameter_server":
        why.append(
            "parameter_server training is asynchronous: workers update the variables in "
            "whatever order they finish steps"
        )
    if gpus:
        why.append(
            "GPU workers all-reduce with NCCL, whose algorithm and summation order may differ "
            "between node sets and NCCL versions"
        )
    return {"deterministic": not why, "op_determinism": True, "why": why}


def _objective(contract: Any, target_stats: tuple[float, float] | None) -> tuple[Any, list[Any]]:
    """The loss and the per-epoch metrics of the contract's task.

    A regressor's loss is the mean squared error of the standardised target (the model's
    last layer scales back, see ``build_model``), so one learning rate fits targets of any
    scale; its metrics are in the target's units.
    """
    import tf_keras as keras

    if not contract.is_regression:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"]
    var = max((target_stats or (0.0, 1.0))[1], 1e-12)

    def standardised_mse(y_true: Any, y_pred: Any) -> Any:
        import tensorflow as tf

        y_true = tf.reshape(tf.cast(y_true, y_pred.dtype), tf.shape(y_pred))
        return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1) / var

    return standardised_mse, [
        keras.metrics.RootMeanSquaredError(name="rmse"),
        keras.metrics.MeanAbsoluteError(name="mae"),
    ]


def _export(
    model: Any,
    inputs: dict[str, tuple[str, tuple[int | None, ...]]],
    final: Path,
    class_names: list[str] | None,
) -> None:
    """Write the SavedModel with a ``serving_default`` signature, atomically.

    A classifier serves ``probabilities``, ``class_id`` and ``class_name``; a regressor
    (``class_names`` None) serves ``predictions``, one number per row.
    """
    import tensorflow as tf

    names = list(inputs)
    specs = [tf.TensorSpec(shape, dtype, name=name) for name, (dtype, shape) in inputs.items()]

    @tf.function(input_signature=specs)
    def serve(*tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        out = model(dict(zip(names, tensors, strict=True)), training=False)
        if class_names is None:
            return {"predictions": tf.reshape(out, [-1])}
        probs = tf.nn.softmax(out, axis=-1)
        class_id = tf.argmax(probs, axis=-1, output_type=tf.int64)
        return {
            "probabilities": probs,
            "class_id": class_id,
            "class_name": tf.gather(tf.constant(class_names), class_id),
        }

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        # what serving loads is the signature: no per-layer Keras traces (2-6 s of tracing
        # per export) and no optimizer state (checkpoints keep that)
        model.save(
            str(tmp),
            save_format="tf",
            include_optimizer=False,
            save_traces=False,
            signatures={"serving_default": serve},
        )
        fsync_tree(tmp)
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.cache
def _callback_classes() -> tuple[type, type, type]:
    """The Keras callbacks, defined on first use so importing this module stays TF-free."""
    import tf_keras as keras

    class _HistoryRecorder(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        """Per-epoch history kept on the checkpoint volume across attempts (chief writes)."""

        def __init__(self, path: Path, is_chief: bool, attempt: int) -> None:
            super().__init__()
            self.path, self.is_chief, self.attempt = path, is_chief, attempt
            self.state: dict[str, Any] = {"epochs": [], "attempts": []}
            if path.exists():
                self.state = json.loads(path.read_text(encoding="utf-8"))
            self.nan = False
            self.epochs_run = 0
            self._started = False

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if not self._started:
                self._started = True
                self.state["attempts"].append({"attempt": self.attempt, "start_epoch": epoch})
                self.state["epochs"] = [e for e in self.state["epochs"] if e["epoch"] < epoch]
                self._save()

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            row = {"epoch": epoch, "attempt": self.attempt}
            for k, v in (logs or {}).items():
                value = float(v)
                row[k] = value
                if k == "loss" and not math.isfinite(value):
                    self.nan = True
                    self.model.stop_training = True
            self.state["epochs"].append(row)
            self.epochs_run += 1
            self._save()

        def _save(self) -> None:
            if self.is_chief:
                atomic_write_json(self.path, self.state)

    class _FaultCallback(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def __init__(self, fault: Fault, role: Role) -> None:
            super().__init__()
            self.fault, self.role, self.epoch = fault, role, -1

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if (
                self.fault.kind == "kill_mid_epoch"
                and self.epoch == self.fault.epoch
                and batch >= 2
            ):
                _say(self.role, "fault injected: SIGKILL mid-epoch")
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if self.fault.kind == "exit_after_epoch" and epoch + 1 == self.fault.epoch:
                _say(self.role, f"fault injected: exiting after epoch {epoch + 1}")
                os._exit(EXIT_FAULT)

    class _ProgressLogger(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        """Epoch, step, loss, rate and ETA every ``TRAINYARD_PROGRESS_S`` seconds."""

        def __init__(self, role: Role, epochs: int, steps: int, replicas: int) -> None:
            """``replicas``: whose step losses Keras sums (0: show no loss)."""
            super().__init__()
            self.role, self.epochs, self.steps, self.replicas = role, epochs, steps, replicas
            self._supports_tf_logs = True  # raw logs: converted only when a line is due
            self.interval = progress_interval()
            self.epoch = self.first_epoch = -1
            self.t0 = self.last = 0.0
            self.done0 = -1  # the step the rate counts from (after the first, which traces)

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if self.first_epoch < 0:
                self.first_epoch = epoch
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            now = time.monotonic()
            done = (self.epoch - self.first_epoch) * self.steps + batch + 1
            if self.done0 < 0:
                self.done0, self.t0, self.last = done, now, now
                return
            if now - self.last < self.interval:
                return
            self.last = now
            left = (self.epochs - self.epoch) * self.steps - batch - 1
            rate = (done - self.done0) / max(now - self.t0, 1e-6) or 1e-6
            loss = ""
            if self.replicas and logs and "loss" in logs:
                loss = f" loss {float(logs['loss']) / self.replicas:.4f}"
            _say(
                self.role,
                f"epoch {self.epoch + 1}/{self.epochs} step {batch + 1}/{self.steps}{loss}, "
                f"{rate:.1f} steps/s, ETA {human_seconds(left / rate)}",
            )

    return _HistoryRecorder, _FaultCallback, _ProgressLogger
