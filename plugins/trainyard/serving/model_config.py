"""TF Serving's model config file: which versions of which models are served.

trainyard writes it; TF Serving (``--model_config_file``, polled with
``--model_config_file_poll_wait_seconds``) and trainyard's own server
(``trainyard serve --model-config-file``) read it, so what is served follows the registry
on both: the champion has the label ``stable``, a candidate being smoke-tested ``canary``,
and every other version directory is left alone.

Two files hold the same entries (text protobuf, ``tensorflow.serving.ModelServerConfig``):

* ``<serving_root>/<model>/model.config``: one model (a Kubernetes serving Deployment per
  model reads its own; TF Serving ignores non-numeric names in a base path);
* ``<serving_root>/models.config``: every model (the compose ``tf-serving`` container and
  the local server), rebuilt from the per-model files under a lock.

Base paths are written as the writer sees them; every reader mounts the serving root at
the same path (``/volumes/_serving`` in containers, the volume root locally).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.errors import DeployError
from trainyard.fsutil import atomic_write_bytes

ALL_MODELS_FILE = "models.config"
MODEL_FILE = "model.config"
STABLE, CANARY = "stable", "canary"
_LOCK_FILE = ".models.config.lock"


@dataclass(frozen=True)
class ServedModel:
    """One model's entry: its base path, the versions to serve, their labels.

    Attributes:
        name: Model name (``/v1/models/<name>``).
        base_path: Directory holding its numeric version folders.
        versions: Versions to serve (TF Serving's ``specific`` policy); empty serves the
            highest version (``latest``).
        labels: Version labels (``stable``, ``canary``) → version.
    """

    name: str
    base_path: str
    versions: tuple[int, ...] = ()
    labels: Mapping[str, int] = field(default_factory=dict)


def _pb() -> tuple[object, object]:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    return text_format, model_server_config_pb2


def render(models: list[ServedModel]) -> str:
    """The text protobuf TF Serving reads, models sorted by name."""
    text_format, pb = _pb()
    config = pb.ModelServerConfig()  # type: ignore[attr-defined]
    entries = config.model_config_list.config
    for m in sorted(models, key=lambda m: m.name):
        e = entries.add()
        e.name = m.name
        e.base_path = m.base_path
        e.model_platform = "tensorflow"
        if m.versions:
            e.model_version_policy.specific.versions.extend(sorted(set(m.versions)))
        else:
            e.model_version_policy.latest.num_versions = 1
        for label, version in sorted(m.labels.items()):
            e.version_labels[label] = int(version)
    text: str = text_format.MessageToString(config)  # type: ignore[attr-defined]
    return text or "model_config_list {\n}\n"


def parse(text: str, source: str = "model config") -> list[ServedModel]:
    """Read a model config file's text.

    Raises:
        DeployError: If it is not a ``ModelServerConfig`` with a ``model_config_list``.
    """
    text_format, pb = _pb()
    config = pb.ModelServerConfig()  # type: ignore[attr-defined]
    try:
        text_format.Parse(text, config)  # type: ignore[attr-defined]
    except Exception as e:  # text_format.ParseError, UnicodeError
        raise DeployError(f"{source}: not a TF Serving model config: {e}") from e
    if config.WhichOneof("config") == "custom_model_config":
        raise DeployError(f"{source}: custom_model_config is not supported")
    out = []
    seen: set[str] = set()
    for e in config.model_config_list.config:
        # as TF Serving refuses them (server_core.cc ValidateModelConfigList)
        if not e.name:
            raise DeployError(f"{source}: a model without a name")
        if e.name in seen:
            raise DeployError(f"{source}: illegal to list model {e.name!r} multiple times")
        seen.add(e.name)
        if not e.base_path:
            raise DeployError(f"{source}: model {e.name!r} has no base_path")
        policy = e.model_version_policy
        kind = policy.WhichOneof("policy_choice")
        if kind not in (None, "latest", "specific"):
            raise DeployError(f"{source}: model {e.name!r}: version policy {kind!r} unsupported")
        if kind == "latest" and policy.latest.num_versions > 1:
            raise DeployError(f"{source}: model {e.name!r}: latest num_versions > 1 unsupported")
        versions = tuple(policy.specific.versions) if kind == "specific" else ()
        stray = sorted(v for v in e.version_labels.values() if v not in versions)
        if versions and stray:
            raise DeployError(
                f"{source}: model {e.name!r}: version labels name versions the policy does "
                f"not serve ({stray}; served: {list(versions)})"
            )
        out.append(ServedModel(e.name, e.base_path, versions, dict(e.version_labels)))
    return out


def read(path: Path) -> list[ServedModel] | None:
    """The models a config file lists, or None when there is no such file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeError) as e:
        raise DeployError(f"{path}: cannot read the model config: {e}") from e
    return parse(text, str(path))


@contextlib.contextmanager
def _locked(serving_root: Path) -> Iterator[None]:
    serving_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(serving_root / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _collect(serving_root: Path) -> list[ServedModel]:
    models = []
    for entry in sorted(os.scandir(serving_root), key=lambda e: e.name):
        cfg = Path(entry.path) / MODEL_FILE
        if entry.name.startswith(".") or not entry.is_dir() or not cfg.is_file():
            continue
        models.extend(read(cfg) or [])
    return models


def set_served(
    serving_root: Path,
    model: str,
    versions: list[int],
    labels: Mapping[str, int] | None = None,
) -> ServedModel | None:
    """Serve exactly ``versions`` of ``model`` (none: stop serving it); rewrite both files.

    Args:
        serving_root: The serving root (``<volume_root>/_serving``).
        model: Model name, a folder below ``serving_root``.
        versions: Versions to serve; an empty list stops serving the model (its file then
            lists no model).
        labels: Version labels; each must name one of ``versions``.

    Returns:
        The entry written, or None when the model was removed.

    Raises:
        DeployError: If a label names a version that is not served.
    """
    serving_root = Path(serving_root)
    labels = dict(labels or {})
    stray = {k: v for k, v in labels.items() if v not in versions}
    if stray:
        raise DeployError(f"model {model}: labels {stray} name versions not in {versions}")
    base = serving_root / model
    entry = None
    if versions:
        entry = ServedModel(model, str(base), tuple(sorted(set(versions))), labels)
    with _locked(serving_root):
        # a model served by nobody keeps an empty file: a server polling it unloads the model
        base.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(base / MODEL_FILE, render([entry] if entry else []).encode())
        atomic_write_bytes(serving_root / ALL_MODELS_FILE, render(_collect(serving_root)).encode())
    return entry


def ensure_config(serving_root: Path) -> Path:
    """Create ``models.config`` from the per-model files when it is missing; its path."""
    serving_root = Path(serving_root)
    path = serving_root / ALL_MODELS_FILE
    if not path.is_file():
        with _locked(serving_root):
            if not path.is_file():
                atomic_write_bytes(path, render(_collect(serving_root)).encode())
    return path


def served(serving_root: Path, model: str) -> ServedModel | None:
    """The entry of ``model`` in its per-model file, or None."""
    found = read(Path(serving_root) / model / MODEL_FILE)
    return found[0] if found else None
