"""Run a rendered pod's container as a local process: the local runner's only difference.

A step pod (or a training Job's pod template) says what the cluster runs: command, args,
environment and volume mounts. :func:`local_process` turns it into an argv and an
environment for this machine, mapping each path the container sees to a local one:

* ``/volumes`` and every mount below it → the local volume root (the same layout),
* ``emptyDir`` mounts (``/tmp``) → a private temporary folder,
* ``/airflow/xcom`` (where the pod writes its result) → a folder the runner reads back,
* the images' baked folders (contracts, pipelines) → the checkout's.

``python`` is this interpreter. Nothing else changes: the same flags, the same variables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import ConfigError
from trainyard.k8s.objects import VOLUME_ROOT

XCOM_DIR = "/airflow/xcom"
XCOM_PATH = f"{XCOM_DIR}/return.json"
"""Where a step pod writes its result (KubernetesPodOperator's XCom sidecar reads it)."""
TERMINATION_LOG = "/dev/termination-log"
"""Where a step pod writes its one-line error (the pod's ``terminationMessagePath``)."""
IMAGE_DIRS = {
    "/opt/trainyard/data_contracts": "contracts_dir",
    "/opt/airflow/dags/pipelines": "pipelines_dir",
    "/opt/trainyard/dags/pipelines": "pipelines_dir",
}
"""Folders baked into the images, and the setting that names the checkout's copy."""
_PLUGINS_DIR = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocalProcess:
    """A container as a local process.

    Attributes:
        argv: Command and arguments, paths mapped.
        env: Environment: this process's, then the container's (paths mapped).
        paths: Container path → local path, longest first.
    """

    argv: list[str]
    env: dict[str, str]
    paths: tuple[tuple[str, str], ...]

    def local(self, container_path: str) -> Path:
        """The local path of a path the container sees."""
        return Path(map_value(container_path, self.paths))


def map_value(value: str, paths: tuple[tuple[str, str], ...]) -> str:
    """``value`` with its leading container path replaced by the local one, if it has one.

    Args:
        value: An argument or environment value.
        paths: Container path → local path pairs, longest container path first.

    Returns:
        The mapped value (unchanged when it starts with no mapped path).
    """
    for inside, outside in paths:
        if value == inside or value.startswith(inside + "/"):
            return outside + value[len(inside) :]
    return value


def path_map(
    volumes: list[Any],
    mounts: list[Any],
    *,
    volume_root: Path,
    scratch: Path,
    settings: Any,
) -> tuple[tuple[str, str], ...]:
    """Container paths → local paths for one container.

    Args:
        volumes: The pod's ``V1Volume`` list.
        mounts: The container's ``V1VolumeMount`` list.
        volume_root: The local volume root (``/volumes`` maps to it).
        scratch: A private folder for ``emptyDir`` mounts and the XCom folder.
        settings: ``trainyard.settings.Settings`` (the checkout's folders).

    Returns:
        Pairs, longest container path first.

    Raises:
        ConfigError: If a mount is neither below ``/volumes`` nor an ``emptyDir``.
    """
    kinds = {v.name: v for v in volumes}
    pairs: dict[str, str] = {VOLUME_ROOT: str(volume_root)}
    for m in mounts:
        vol = kinds.get(m.name)
        path = m.mount_path.rstrip("/")
        if vol is not None and vol.empty_dir is not None:
            local = scratch / f"emptydir-{m.name}"
            local.mkdir(parents=True, exist_ok=True)
            pairs[path] = str(local)
        elif path == VOLUME_ROOT or path.startswith(VOLUME_ROOT + "/"):
            pairs[path] = str(volume_root) + path[len(VOLUME_ROOT) :]
        else:
            raise ConfigError(f"mount {m.name!r} at {path}: no local equivalent")
    xcom = scratch / "xcom"
    xcom.mkdir(parents=True, exist_ok=True)
    pairs[XCOM_DIR] = str(xcom)
    pairs[TERMINATION_LOG] = str(scratch / "termination-log")
    for inside, attr in IMAGE_DIRS.items():
        pairs[inside] = str(getattr(settings, attr))
    return tuple(sorted(pairs.items(), key=lambda kv: -len(kv[0])))


def local_process(
    pod_spec: Any,
    *,
    volume_root: Path,
    scratch: Path,
    settings: Any,
    base_env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> LocalProcess:
    """The first container of a pod spec as a local process.

    Args:
        pod_spec: A ``V1PodSpec`` (a step pod's, or a Job's pod template's).
        volume_root: The local volume root.
        scratch: A private folder (``emptyDir`` mounts, the result file).
        settings: The local settings (the checkout's folders).
        base_env: The environment the process starts from (default: this process's).
        extra_env: Variables set last (the launcher's: index, host map, parent pid).

    Returns:
        Argv and environment.

    Raises:
        ConfigError: If the container has no command or mounts something unmappable.
    """
    container = pod_spec.containers[0]
    if not container.command:
        raise ConfigError(f"container {container.name!r} has no command")
    paths = path_map(
        pod_spec.volumes or [],
        container.volume_mounts or [],
        volume_root=volume_root,
        scratch=scratch,
        settings=settings,
    )
    argv = [map_value(a, paths) for a in [*container.command, *(container.args or [])]]
    if argv[0] == "python":
        argv[0] = sys.executable
    env = dict(os.environ if base_env is None else base_env)
    for var in container.env or []:
        if var.value is not None:
            env[var.name] = map_value(var.value, paths)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_PLUGINS_DIR), env.get("PYTHONPATH", "")) if p
    )
    env.update(extra_env or {})
    return LocalProcess(argv=argv, env=env, paths=paths)
