"""Model versions under a TF Serving base path: discovery, loading, warm-up, swap.

Layout: ``<base_path>/<model_name>/<n>/`` is a SavedModel (``n`` numeric; anything else,
such as ``.tmp-*``, is ignored). Policy, as TF Serving's "latest" with availability
preservation: the highest version directory that has not failed to load is aspired; it is
loaded and warmed up in a background thread while the previous version keeps serving, and
only once it is ``AVAILABLE`` are the other versions unloaded. A version whose directory
disappears is unloaded (after the next highest is available), which is how a rollback
reaches the server. Requests that already hold a version finish on it. Each request runs
alone on the repository's model threads: no batching across clients (TF Serving batches
only with ``--enable_batching``, which the laptop's server does not need).

TensorFlow is imported only inside the functions that load a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainyard.fsutil import read_json
from trainyard.serving.schema import (
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    FeatureSpec,
    parse_feature_spec,
)

log = logging.getLogger("trainyard.serving")

SPEC_FILE = Path("assets.extra") / "trainyard.json"
_INT64_MAX = 2**63 - 1
SIGNATURE = DEFAULT_SIGNATURE


_threads_configured = False


def configure_tf_threads(intra_op: int, inter_op: int) -> bool:
    """Size TensorFlow's thread pools for this process (once, before it runs any op).

    A server runs several model calls at once, one per predict thread; letting each call
    also fan out over every core makes the calls contend and spin for each other. With
    ``intra_op=1`` every call runs on its own thread and concurrent requests use the cores
    (TF Serving's ``--tensorflow_intra_op_parallelism``). 0 keeps TensorFlow's default.

    Args:
        intra_op: Threads one op may use (0: TensorFlow's default, one per core).
        inter_op: Ops of one call that may run at once (0: TensorFlow's default).

    Returns:
        True if applied; False if TensorFlow had already started in this process (for
        instance a server inside a test process), in which case its sizes stay.
    """
    global _threads_configured
    import tensorflow as tf

    if _threads_configured:
        return True
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError as e:
        log.info("TensorFlow thread pools already initialised, keeping them: %s", e)
        return False
    _threads_configured = True
    return True


class ModelNotFound(LookupError):
    """No servable version of the requested model (HTTP 404)."""


class LabelNotFound(LookupError):
    """A version label the model config does not give the model (TF Serving: 400)."""


class SignatureNotFound(LookupError):
    """The request names a signature the SavedModel does not have (TF Serving: 400)."""


@dataclass
class ServedSignature:
    """One SignatureDef of a loaded version, ready to run.

    Attributes:
        name: The signature key (``serving_default``, ``classify``, ...).
        method: Its ``method_name`` (``tensorflow/serving/predict``, ``.../classify``,
            ``.../regress``), which decides the REST verbs that may run it.
        input_spec: Inputs: name → (dtype, shape), batch first.
        output_spec: Outputs: name → (dtype, shape), batch first where batched.
        fn: The concrete function.
        executor: The model threads it runs on (None: asyncio's default executor).
    """

    name: str
    method: str
    input_spec: FeatureSpec
    output_spec: FeatureSpec
    fn: Any
    executor: Executor | None = field(default=None, repr=False)
    # The function's flat argument order when it is a ConcreteFunction whose arguments are
    # exactly the inputs by name; None: call it with keyword arguments.
    _flat_args: tuple[str, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            keywords = tuple(str(k) for k in self.fn._arg_keywords)
        except (AttributeError, TypeError):
            return
        if callable(getattr(self.fn, "_call_flat", None)) and sorted(keywords) == sorted(
            self.input_spec
        ):
            self._flat_args = keywords

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature on numpy inputs (blocking; call from a worker thread).

        A call with keyword arguments binds them to the structured signature, casts them
        and, if that fails, falls back to the flat signature: about 100 us of Python per
        call. Inputs that are exactly the function's arguments go to the flat call
        directly, as that fallback does; anything else takes the keyword call.
        """
        import tensorflow as tf

        order = self._flat_args
        if order is not None and len(inputs) == len(order) and all(k in inputs for k in order):
            result = self.fn._call_flat(
                [tf.constant(inputs[k]) for k in order], self.fn.captured_inputs
            )
        else:
            result = self.fn(**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in result.items()}

    async def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature on one request's inputs on a model thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.run, inputs)


@dataclass
class LoadedVersion:
    """A SavedModel version loaded in memory and ready to run.

    Attributes:
        model: Model name.
        version: Version number.
        path: The version directory it was loaded from.
        signatures: Every servable signature by key; ``serving_default`` (when the model
            has it) is what a request that names no signature runs.
        saved_model: The loaded object, kept alive because the functions use its variables.
    """

    model: str
    version: int
    path: Path
    signatures: dict[str, ServedSignature]
    saved_model: Any = field(default=None, repr=False)
    _signature_defs: Any = field(default=None, init=False, repr=False)

    def signature(self, name: str | None = None) -> ServedSignature:
        """The signature a request names (``None`` or ``""``: ``serving_default``).

        Raises:
            SignatureNotFound: With TF Serving's message, if the model lacks it.
        """
        key = name or SIGNATURE
        sig = self.signatures.get(key)
        if sig is None:
            raise SignatureNotFound(f'Serving signature key "{key}" not found.')
        return sig

    @property
    def feature_spec(self) -> FeatureSpec:
        """The default signature's inputs (name → (dtype, shape))."""
        return self.signature().input_spec

    @property
    def output_spec(self) -> FeatureSpec:
        """The default signature's outputs (name → (dtype, shape))."""
        return self.signature().output_spec

    def signature_defs(self) -> Any:
        """The SavedModel's ``SignatureDef`` protos (name → proto), as TF Serving reports them.

        Read from ``saved_model.pb`` once, on first use (metadata requests only).
        """
        if self._signature_defs is None:
            self._signature_defs = _read_signature_defs(self.path)
        return self._signature_defs

    async def predict(
        self, inputs: dict[str, np.ndarray], signature: str | None = None
    ) -> dict[str, np.ndarray]:
        """Run a signature (default: ``serving_default``) on one request's inputs."""
        return await self.signature(signature).predict(inputs)


def _read_signature_defs(path: Path) -> Any:
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    return saved.meta_graphs[0].signature_def


def _spec_from_tensor_specs(specs: dict[str, Any]) -> FeatureSpec:
    out: FeatureSpec = {}
    for name, ts in specs.items():
        out[name] = (ts.dtype.name, None if ts.shape.rank is None else tuple(ts.shape.as_list()))
    return out


def load_version(
    model: str,
    version: int,
    path: Path,
    executor: Executor,
) -> LoadedVersion:
    """Load, check and warm up one SavedModel version (blocking).

    Every signature of the SavedModel is served, each with its ``method_name``; a model
    without ``serving_default`` loads too (its requests must name a signature), as in TF
    Serving. The default signature's feature spec comes from ``assets.extra/trainyard.json``
    (written by the deploy step) and must agree with the signature; without that file it is
    derived from the signature. Warm-up runs the default signature once on a zero batch so
    the first request does not pay for tracing and kernel selection; a model with string
    inputs (image bytes, text, ``tf.Example``) may reject an empty string, so there a
    failed warm-up is logged, not fatal.

    Args:
        model: Model name.
        version: Version number.
        path: The SavedModel directory.
        executor: Thread pool the model runs on.

    Returns:
        The loaded version.

    Raises:
        ValueError: If the SavedModel cannot be loaded, has no signature, its default
            signature disagrees with the declared feature spec, or warm-up of a model
            with numeric inputs fails.
    """
    import tensorflow as tf

    if not (path / "saved_model.pb").is_file():
        raise ValueError(f"{path}: no saved_model.pb (not a SavedModel directory)")
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:
        raise ValueError(f"{path}: cannot load SavedModel: {type(e).__name__}: {e}") from e
    if not loaded.signatures:
        raise ValueError(f"{path}: the SavedModel has no signatures to serve")
    defs = _read_signature_defs(path)
    signatures: dict[str, ServedSignature] = {}
    for key, fn in loaded.signatures.items():
        outputs = _spec_from_tensor_specs(fn.structured_outputs)
        sig = ServedSignature(
            name=key,
            method=defs[key].method_name if key in defs else PREDICT_METHOD,
            input_spec=_spec_from_tensor_specs(fn.structured_input_signature[1]),
            output_spec=outputs,
            fn=fn,
            executor=executor,
        )
        signatures[key] = sig
    default = signatures.get(SIGNATURE)
    spec_path = path / SPEC_FILE
    if default is not None and spec_path.is_file():
        try:
            declared = parse_feature_spec(read_json(spec_path).get("feature_spec"), str(spec_path))
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{spec_path}: invalid feature spec: {e}") from e
        _check_compatible(declared, default.input_spec, path)
        default.input_spec = declared
    if default is not None:
        _warm_up(default, path)
    return LoadedVersion(
        model=model, version=version, path=path, signatures=signatures, saved_model=loaded
    )


def _warm_up(sig: ServedSignature, path: Path) -> None:
    """Run ``sig`` once on a one-row batch of zeros (empty strings); see load_version.

    An input of unknown rank gets one zero; a failed warm-up of such a signature is logged,
    not fatal, as for string inputs.
    """
    lenient = any(dtype == "string" or shape is None for dtype, shape in sig.input_spec.values())
    warm = {
        name: np.zeros(
            [1] if shape is None else [1 if d is None else d for d in shape],
            dtype=object if dtype == "string" else dtype,
        )
        for name, (dtype, shape) in sig.input_spec.items()
    }
    for name, (dtype, _) in sig.input_spec.items():
        if dtype == "string":
            warm[name].fill(b"")
    try:
        sig.run(warm)
    except Exception as e:
        if lenient:
            log.info("%s: no warm-up (%s: %s)", path, type(e).__name__, e)
            return
        raise ValueError(f"{path}: warm-up prediction failed: {type(e).__name__}: {e}") from e


def _check_compatible(declared: FeatureSpec, signature: FeatureSpec, path: Path) -> None:
    if set(declared) != set(signature):
        raise ValueError(
            f"{path}: signature inputs {sorted(signature)} differ from the contract's "
            f"features {sorted(declared)}"
        )
    for name, (dtype, shape) in declared.items():
        sdtype, sshape = signature[name]
        if sdtype != dtype:
            raise ValueError(
                f"{path}: input {name!r} is {sdtype} in the signature, {dtype} in the contract"
            )
        if sshape is None or shape is None:
            continue  # a signature input of unknown rank takes any shape
        if len(sshape) != len(shape) or any(
            s is not None and d is not None and s != d for s, d in zip(sshape, shape, strict=True)
        ):
            raise ValueError(
                f"{path}: input {name!r} has shape {list(sshape)} in the signature, "
                f"{list(shape)} in the contract"
            )


@dataclass
class VersionRecord:
    """What the server knows about one version directory (TF Serving's version status)."""

    version: int
    state: str  # START | LOADING | AVAILABLE | UNLOADING | END
    error_code: str = "OK"
    error_message: str = ""
    stamp: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """TF Serving's ``model_version_status`` entry."""
        return {
            "version": str(self.version),
            "state": self.state,
            "status": {"error_code": self.error_code, "error_message": self.error_message},
        }


def _stamp(path: Path) -> tuple[int, ...] | None:
    """What a version directory looks like now: its mtime and its files' sizes and mtimes.

    A version that failed to load is tried again once this changes, so one copied in
    pieces (``saved_model.pb`` first, the variables still being written) loads once the
    copy is complete.
    """
    out: list[int] = []
    try:
        out.append(path.stat().st_mtime_ns)
        for sub in (path, path / "variables"):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for entry in sorted(os.scandir(sub), key=lambda e: e.name):
                    if entry.is_file():
                        st = entry.stat()
                        out += [st.st_size, st.st_mtime_ns]
    except OSError:
        return None
    return tuple(out)


def scan_versions(model_dir: Path | str) -> dict[int, Path]:
    """Numbered version directories of one model (its TF Serving base path).

    Returns:
        Version → directory; hidden entries, files, non-numeric names and numbers beyond
        int64 are skipped.
    """
    versions: dict[int, Path] = {}
    try:
        entries = list(os.scandir(model_dir))
    except (FileNotFoundError, NotADirectoryError):
        return versions
    for v in entries:
        # as TF Serving: a version is an int64; a larger number is not a version
        if v.name.isdigit() and int(v.name) <= _INT64_MAX and v.is_dir():
            versions[int(v.name)] = Path(v.path)
    return versions


def scan_base_path(base_path: Path) -> dict[str, dict[int, Path]]:
    """Numbered version directories of every model under a base path.

    Args:
        base_path: ``<base_path>/<model>/<n>/``.

    Returns:
        Model name → version → directory. Hidden entries and non-numeric names are skipped.
    """
    try:
        models = list(os.scandir(base_path))
    except FileNotFoundError:
        return {}
    return {
        m.name: scan_versions(m.path) for m in models if not m.name.startswith(".") and m.is_dir()
    }


@dataclass(frozen=True)
class _Plan:
    """What one model should serve: its version folders, the wanted ones, the labels."""

    dirs: dict[int, Path]
    wanted: frozenset[int] | None  # None: the highest version (TF Serving's "latest")
    labels: dict[str, int]


class ModelRepository:
    """Every model under a base path, kept in sync with its version directories.

    Without a model config file every model folder under ``base_path`` serves its highest
    version. With one (TF Serving's ``--model_config_file``, see
    :mod:`trainyard.serving.model_config`), exactly the models and versions it lists are
    served, with its version labels; a missing file serves nothing until it appears.

    ``predict_threads`` model calls run at once (one request each); ``intra_op_threads`` and
    ``inter_op_threads`` (0: TensorFlow's defaults) size TensorFlow's pools before the first
    model loads, see :func:`configure_tf_threads`.
    """

    def __init__(
        self,
        base_path: Path,
        poll_interval: float = 1.0,
        predict_threads: int = 2,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        config_file: Path | None = None,
    ) -> None:
        self.base_path = Path(base_path)
        self.config_file = Path(config_file) if config_file is not None else None
        self._labels: dict[str, dict[str, int]] = {}
        self._last_plan: dict[str, _Plan] = {}
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        self._tf_configured = False
        self.poll_interval = poll_interval
        self.predict_threads = predict_threads
        self.executor = ThreadPoolExecutor(predict_threads, thread_name_prefix="predict")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
        self._base_of: dict[str, Path] = {}
        self._config_error = ""
        self._records: dict[str, dict[int, VersionRecord]] = {}
        self._loaded: dict[str, dict[int, LoadedVersion]] = {}
        self._serving: dict[str, LoadedVersion] = {}
        self._loading: dict[tuple[str, int], asyncio.Future[LoadedVersion]] = {}
        self._lock = asyncio.Lock()

    # ---- lookups (event loop) -------------------------------------------------------

    def get(
        self, model: str, version: int | None = None, label: str | None = None
    ) -> LoadedVersion:
        """The version that serves a request.

        Args:
            model: Model name.
            version: A specific version, or None for the latest available one.
            label: A version label from the model config (``stable``, ``canary``), instead
                of ``version``.

        Returns:
            The loaded version.

        Raises:
            ModelNotFound: If that model or version is not available.
            LabelNotFound: If the model config gives the model no such label.
        """
        if label is not None:
            version = self.version_for_label(model, label)
        if version is None:
            served = self._serving.get(model)
            if served is None:
                raise ModelNotFound(f"Servable not found for request: Latest({model})")
            return served
        lv = self._loaded.get(model, {}).get(version)
        if lv is None:
            raise ModelNotFound(f"Servable not found for request: Specific({model}, {version})")
        return lv

    def status(self, model: str, version: int | None = None) -> list[dict[str, Any]]:
        """TF Serving's ``model_version_status`` list for a model (newest first).

        Raises:
            ModelNotFound: If the model, or the requested version, is unknown.
        """
        records = self._records.get(model)
        if not records:
            raise ModelNotFound(f"Could not find any versions of model {model}")
        if version is not None:
            rec = records.get(version)
            if rec is None:
                raise ModelNotFound(f"Could not find version {version} of model {model}")
            return [rec.to_json()]
        return [records[v].to_json() for v in sorted(records, reverse=True)]

    def models(self) -> list[str]:
        """Names of models with at least one known version."""
        return sorted(m for m, r in self._records.items() if r)

    # ---- synchronisation with the file system -----------------------------------------

    def version_for_label(self, model: str, label: str) -> int:
        """The version a label of the model config points at.

        Raises:
            LabelNotFound: If the model has no such label (TF Serving's InvalidArgument).
        """
        labelled = self._labels.get(model, {}).get(label)
        if labelled is None:
            raise LabelNotFound(f"Unrecognized servable version label: {label}")
        return labelled

    def labels(self, model: str) -> dict[str, int]:
        """The model's version labels from the model config (empty without one)."""
        return dict(self._labels.get(model, {}))

    def _plan(self) -> dict[str, _Plan]:
        if self.config_file is None:
            found = scan_base_path(self.base_path)
            return {m: _Plan(dirs, None, {}) for m, dirs in found.items()}
        from trainyard.errors import DeployError
        from trainyard.serving import model_config

        try:
            listed = model_config.read(self.config_file) or []
        except DeployError as e:
            if str(e) != self._config_error:  # once per problem, not every poll
                log.error("keeping the previous model config: %s", e)
                self._config_error = str(e)
            base_of = self._base_of
            return {
                m: _Plan(scan_versions(base_of.get(m, self.base_path / m)), p.wanted, p.labels)
                for m, p in self._last_plan.items()
            }
        self._config_error = ""
        plan = {}
        for entry in listed:
            self._base_of[entry.name] = Path(entry.base_path)
            wanted = frozenset(entry.versions) if entry.versions else None
            plan[entry.name] = _Plan(scan_versions(entry.base_path), wanted, dict(entry.labels))
        return plan

    async def sync(self) -> None:
        """Scan the base path (or the model config) once; load / unload to match it."""
        async with self._lock:
            plan = await asyncio.get_running_loop().run_in_executor(self._loader, self._plan)
            self._last_plan = plan
            for model in sorted(set(plan) | set(self._records)):
                p = plan.get(model, _Plan({}, None, {}))
                await self._sync_model(model, p.dirs, p.wanted)
                if model in plan:
                    self._labels[model] = p.labels
                else:
                    self._labels.pop(model, None)

    async def _sync_model(
        self, model: str, dirs: dict[int, Path], wanted: frozenset[int] | None = None
    ) -> None:
        records = self._records.setdefault(model, {})
        loaded = self._loaded.setdefault(model, {})
        for v in list(records):
            if v not in dirs and v not in loaded:
                del records[v]
        for v, path in dirs.items():
            rec = records.get(v)
            if rec is not None and rec.state == "END" and rec.error_code != "OK":
                stamp = _stamp(path)
                if stamp is not None and stamp != rec.stamp:
                    del records[v]  # the directory changed since it failed: retry it
        candidates = [
            v
            for v in sorted(dirs, reverse=True)
            if not (records.get(v) and records[v].state == "END" and records[v].error_code != "OK")
            and (wanted is None or v in wanted)
        ]
        aspired = candidates[:1] if wanted is None else candidates
        for v in aspired:
            if v not in loaded:
                await self._load(model, v, dirs[v])
        keep = {v for v in aspired if v in loaded}
        if not keep and not dirs:
            keep = set()
        elif not keep:
            # The aspired version failed or is absent: keep serving what still has a directory,
            # else the newest loaded version, rather than nothing.
            with_dirs = [v for v in loaded if v in dirs]
            keep = {max(with_dirs)} if with_dirs else ({max(loaded)} if loaded else set())
        served = max(keep) if keep else None
        if served is not None:
            self._serving[model] = loaded[served]
        else:
            self._serving.pop(model, None)
        for v in sorted(set(loaded) - keep):
            lv = loaded.pop(v)
            if v in dirs:
                records[v] = VersionRecord(v, "END")
            else:
                records.pop(v, None)
            log.info("model %s version %d unloaded", model, v)
            del lv
        if not records and not loaded:
            self._records.pop(model, None)
            self._loaded.pop(model, None)

    async def _load(self, model: str, version: int, path: Path) -> None:
        records = self._records[model]
        rec = VersionRecord(version, "LOADING", stamp=_stamp(path))
        records[version] = rec
        log.info("model %s version %d loading from %s", model, version, path)
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        if not self._tf_configured and (self.intra_op_threads or self.inter_op_threads):
            await loop.run_in_executor(
                self._loader, configure_tf_threads, self.intra_op_threads, self.inter_op_threads
            )
            self._tf_configured = True
        try:
            lv = await loop.run_in_executor(
                self._loader,
                load_version,
                model,
                version,
                path,
                self.executor,
            )
        except Exception as e:
            rec.state, rec.error_code, rec.error_message = "END", "UNKNOWN", str(e)
            log.error("model %s version %d failed to load: %s", model, version, e)
            return
        self._loaded[model][version] = lv
        # TensorFlow and the model are millions of long-lived objects; a full collection
        # walking them stalls every request for hundreds of ms. Move them out of its way.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        rec.state = "AVAILABLE"
        log.info(
            "model %s version %d AVAILABLE (loaded and warmed up in %.2fs)",
            model,
            version,
            time.perf_counter() - t0,
        )

    async def watch(self, stop: asyncio.Event) -> None:
        """Poll the base path until ``stop`` is set (errors are logged, never fatal)."""
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:
                log.exception("scanning %s failed", self.base_path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.poll_interval)

    def close(self) -> None:
        """Drop every model and stop the worker threads."""
        self._serving.clear()
        self._loaded.clear()
        self.executor.shutdown(wait=True)
        self._loader.shutdown(wait=True)
