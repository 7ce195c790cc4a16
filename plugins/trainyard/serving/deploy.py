"""Deploy a model version: publish, serve it as ``canary``, smoke-test, promote or roll back.

Publishing copies the SavedModel into ``<serving_root>/<model>/.tmp-<n>-<pid>`` (with the
contract's feature spec in ``assets.extra/trainyard.json``), fsyncs it and renames it to
``<n>``, so the server never sees a half-copied version. Which versions are served is the
model config file's business (:mod:`trainyard.serving.model_config`): the champion
(``stable``) and, while it is smoke-tested, the candidate (``canary``). After a good smoke
test the caller's ``promote`` moves the registry's champion pointer and the config then
lists the new champion alone; otherwise the config lists the previous champion alone again
and the candidate's folder is removed. :func:`serve_champion` writes the config from the
registry's champion, which is how promotions, rollbacks and a killed deploy converge.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import trainyard
from trainyard.errors import DeployError
from trainyard.fsutil import (
    atomic_write_json,
    cmdline_has,
    process_alive,
    publish_dir,
    read_json,
    terminate,
)
from trainyard.serving import model_config
from trainyard.serving.client import ServingClient, ServingHTTPError
from trainyard.serving.schema import FeatureSpec, spec_to_json
from trainyard.serving.versions import SPEC_FILE

PID_FILE = ".server.pid"


@dataclass(frozen=True)
class DeployResult:
    """Outcome of :func:`deploy`.

    Attributes:
        version: The deployed version.
        url: Its predict URL.
        status: The server's status entry for the version.
        sample_prediction: The served outputs of the first smoke row.
        smoke_rows: How many holdout rows were checked.
        rolled_back: Whether the deployment was undone.
        reason: Why it succeeded or failed.
    """

    version: int
    url: str
    status: dict[str, Any] = field(default_factory=dict)
    sample_prediction: dict[str, Any] = field(default_factory=dict)
    smoke_rows: int = 0
    rolled_back: bool = False
    reason: str = ""


def _tree_digest(root: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.parts[0] == "assets.extra":
            continue
        h.update(str(rel).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def publish_version(
    model_dir: Path, serving_root: Path, model_name: str, version: int, feature_spec: FeatureSpec
) -> bool:
    """Copy a SavedModel into the base path as version ``version``, atomically.

    Args:
        model_dir: The SavedModel directory (has ``saved_model.pb``).
        serving_root: The server's base path.
        model_name: Model name (a folder below ``serving_root``).
        version: Version number.
        feature_spec: The contract's serving inputs, written to ``assets.extra``.

    Returns:
        True if this call published it; False if the same content was already there.

    Raises:
        DeployError: If ``model_dir`` is not a SavedModel, or version ``version`` already
            exists with different content.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "saved_model.pb").is_file():
        raise DeployError(f"{model_dir}: not a SavedModel directory (no saved_model.pb)")
    final = serving_root / model_name / str(version)
    if final.exists():
        if _tree_digest(final) == _tree_digest(model_dir):
            return False
        raise DeployError(f"{final}: version {version} is already published with different content")
    tmp = serving_root / model_name / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(model_dir, tmp)
        atomic_write_json(
            tmp / SPEC_FILE,
            {"model": model_name, "version": version, "feature_spec": spec_to_json(feature_spec)},
        )
        if not publish_dir(tmp, final):
            raise DeployError(f"{final}: another deploy published version {version} concurrently")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def unpublish_version(serving_root: Path, model_name: str, version: int) -> bool:
    """Remove a version from the base path (rename out of sight first, then delete).

    Returns:
        True if the version existed.
    """
    final = serving_root / model_name / str(version)
    trash = serving_root / model_name / f".tmp-del-{version}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(final, trash)
    except FileNotFoundError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


def wait_available(
    client: ServingClient, model: str, version: int, timeout_s: float
) -> dict[str, Any]:
    """Poll the server until ``version`` of ``model`` is AVAILABLE.

    Returns:
        The version's status entry.

    Raises:
        DeployError: If loading failed (with the server's error message) or the timeout passed.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            entries = client.status(model, version)
            entry = entries[0]
            if entry["state"] == "AVAILABLE":
                return entry
            err = entry.get("status", {})
            if entry["state"] == "END" and err.get("error_code", "OK") != "OK":
                raise DeployError(
                    f"version {version} of {model} failed to load: {err.get('error_message')}"
                )
            last = f"state {entry['state']}"
        except ServingHTTPError as e:
            last = e.message
        except (OSError, ConnectionError) as e:
            last = f"{type(e).__name__}: {e}"
            client.close()
        if time.monotonic() > deadline:
            raise DeployError(
                f"version {version} of {model} not AVAILABLE after {timeout_s:.0f}s ({last})"
            )
        time.sleep(0.1)


def wait_unloaded(client: ServingClient, model: str, version: int, timeout_s: float) -> None:
    """Poll the server until ``version`` of ``model`` is unloaded (END or not reported).

    Raises:
        DeployError: If it still does after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = client.status(model, version)[0]["state"]
            if state == "END":
                return
        except ServingHTTPError as e:
            if e.status == 404:
                return
            state = e.message
        except (OSError, ConnectionError) as e:
            state = f"{type(e).__name__}: {e}"
            client.close()
        if time.monotonic() > deadline:
            raise DeployError(f"server still reports version {version} of {model} ({state})")
        time.sleep(0.1)


def _smoke(
    client: ServingClient,
    model: str,
    version: int,
    smoke_inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, Sequence[Any]],
) -> dict[str, Any]:
    """Predict the smoke rows over HTTP; the one expected output must match.

    Class ids must be equal; a regressor's numbers equal to float32 precision (the server
    and the offline evaluation may batch differently).
    """
    ((output, want),) = expected.items()
    outputs = client.predict(
        model, inputs={k: np.asarray(v) for k, v in smoke_inputs.items()}, version=version
    )
    if not isinstance(outputs, dict):  # a model with one output answers it bare
        outputs = {output: outputs}
    if output not in outputs:
        raise DeployError(f"smoke test: response has no {output!r} output: {str(outputs)[:200]}")
    served = np.asarray(outputs[output], dtype=np.float64).reshape(-1)
    exp = np.asarray(want, dtype=np.float64).reshape(-1)
    if served.shape != exp.shape:
        raise DeployError(f"smoke test: {served.size} predictions for {exp.size} rows")
    if output == "class_id":
        same = served == exp
    else:
        same = np.isclose(served, exp, rtol=1e-4, atol=1e-5)
    diff = np.flatnonzero(~same)
    if diff.size:
        i = int(diff[0])
        raise DeployError(
            f"smoke test: {diff.size} of {exp.size} holdout rows differ from the offline "
            f"evaluation (row {i}: served {output} {served[i]:g}, expected {exp[i]:g})"
        )
    return {k: v[0] for k, v in outputs.items()}


def serve_champion(
    serving_root: Path,
    model_name: str,
    champion: int | None,
    model_dir: Path | None,
    feature_spec: FeatureSpec | None,
) -> str:
    """Make the model config serve the registry's champion alone (publishing it if needed).

    Called before every deploy and after every promote or rollback, so what is served
    converges on the registry after any kill (a candidate left as ``canary`` stops being
    served) and a rollback reaches the servers within their poll interval.

    Args:
        serving_root: The serving root.
        model_name: The served model name.
        champion: The registry's champion, or None (the model is then not served).
        model_dir: The champion's SavedModel (published again if its folder is gone).
        feature_spec: The contract's serving inputs (for publishing).

    Returns:
        One line saying what is served now.
    """
    serving_root = Path(serving_root)
    if champion is None:
        model_config.set_served(serving_root, model_name, [])
        return f"{model_name}: no champion, not served"
    if not (serving_root / model_name / str(champion)).is_dir():
        if model_dir is None or feature_spec is None:
            raise DeployError(f"{model_name}: champion {champion} is not published")
        publish_version(Path(model_dir), serving_root, model_name, champion, feature_spec)
    model_config.set_served(serving_root, model_name, [champion], {model_config.STABLE: champion})
    return f"{model_name}: serving version {champion} (stable)"


def deploy(
    model_name: str,
    version: int,
    model_dir: Path,
    serving_root: Path,
    host: str,
    port: int,
    smoke_inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, Sequence[Any]],
    feature_spec: FeatureSpec,
    previous_version: int | None,
    timeout_s: float = 120.0,
    *,
    promote: Callable[[], None] | None = None,
    raise_on_rollback: bool = True,
) -> DeployResult:
    """Publish a version, serve it as canary, smoke-test it, promote it or roll back.

    Args:
        model_name: Model name in the base path.
        version: The version to deploy (the registry's version number).
        model_dir: Its SavedModel directory.
        serving_root: The server's base path.
        host: Server host.
        port: Server port (a server must answer there, see :func:`ensure_local_server`).
        smoke_inputs: Holdout rows, feature name → array (batch first).
        expected: The offline evaluation's predictions for those rows, of one output
            (``{"class_id": [...]}`` or ``{"predictions": [...]}``).
        feature_spec: The contract's serving inputs.
        previous_version: The champion served before (restored on failure), or None.
        timeout_s: How long to wait for the version (and for a rollback) to be AVAILABLE.
        promote: Called once the smoke test passed (moves the registry's champion pointer);
            if it raises, the deploy rolls back.
        raise_on_rollback: Raise after rolling back (default) instead of returning a
            result with ``rolled_back=True``.

    Returns:
        The result.

    Raises:
        DeployError: After a rollback (names the reason and whether the previous version
            serves again), unless ``raise_on_rollback`` is False.
    """
    serving_root = Path(serving_root)
    url = f"http://{host}:{port}/v1/models/{model_name}/versions/{version}:predict"
    rows = len(next(iter(expected.values())))
    client = ServingClient(host, port)
    ours = False  # the version dir is this deploy's (just published, or same content)
    served = [v for v in (previous_version, version) if v is not None]
    labels = {model_config.CANARY: version}
    if previous_version is not None and previous_version != version:
        labels[model_config.STABLE] = previous_version
    try:
        try:
            publish_version(Path(model_dir), serving_root, model_name, version, feature_spec)
            ours = True
            model_config.set_served(serving_root, model_name, served, labels)
            status = wait_available(client, model_name, version, timeout_s)
            sample = _smoke(client, model_name, version, smoke_inputs, expected)
            if promote is not None:
                promote()
            model_config.set_served(
                serving_root, model_name, [version], {model_config.STABLE: version}
            )
        except DeployError as e:
            reason = str(e)
        except Exception as e:  # any failure rolls back; the reason names it
            reason = f"{type(e).__name__}: {e}"
        else:
            return DeployResult(
                version=version,
                url=url,
                status=status,
                sample_prediction=sample,
                smoke_rows=rows,
                reason=f"version {version} AVAILABLE; {rows} smoke rows match offline evaluation",
            )
        restored = _rollback(
            client, serving_root, model_name, version, previous_version, ours, timeout_s
        )
        result = DeployResult(
            version=version,
            url=url,
            smoke_rows=rows,
            rolled_back=True,
            reason=f"{reason}; {restored}",
        )
        if raise_on_rollback:
            raise DeployError(
                f"deploy of {model_name} version {version} rolled back: {result.reason}"
            )
        return result
    finally:
        client.close()


def _rollback(
    client: ServingClient,
    serving_root: Path,
    model: str,
    version: int,
    previous: int | None,
    ours: bool,
    timeout_s: float,
) -> str:
    if previous is None:
        model_config.set_served(serving_root, model, [])
    else:
        model_config.set_served(serving_root, model, [previous], {model_config.STABLE: previous})
    if not ours:
        return f"left {serving_root / model / str(version)} alone (not published by this deploy)"
    if previous != version:
        unpublish_version(serving_root, model, version)
        try:
            wait_unloaded(client, model, version, timeout_s)
        except DeployError as e:
            return f"removed version {version}, but {e}"
    if previous is None:
        return f"removed version {version}; no previous version to restore"
    if not (serving_root / model / str(previous)).is_dir():
        where = serving_root / model
        return f"removed version {version}; previous version {previous} is not in {where}"
    try:
        wait_available(client, model, previous, timeout_s)
    except DeployError as e:
        return f"removed version {version}; previous version {previous} did not come back: {e}"
    return f"removed version {version}; previous version {previous} is AVAILABLE again"


# ---- the local server process --------------------------------------------------------


def _answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TF-Serving-compatible server answers on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError:
        return False
    client = ServingClient(host, port, timeout=timeout)
    try:
        status, data = client.request("GET", "/v1/models/__trainyard_probe__")
    except (OSError, ConnectionError):
        return False
    finally:
        client.close()
    return status in (200, 404) and b"error" in data


def check_port_is_ours(serving_root: Path, host: str, port: int) -> bool:
    """Refuse a serving port held by something that is not this checkout's model server.

    Free, or a model server of ``serving_root`` (or one trainyard did not start that
    answers as a model server), passes.

    Args:
        serving_root: This checkout's serving base path.
        host: The serving host.
        port: The serving port.

    Returns:
        Whether a model server answers there (False: the port is free).

    Raises:
        DeployError: Naming the port and what holds it.
    """
    if _answers(host, port):
        other = _other_trainyard_server(port, Path(serving_root))
        if other is not None:
            raise DeployError(
                f"{host}:{port} is taken by another trainyard server (pid {other[0]}) "
                f"serving {other[1]}, not {serving_root}: stop it (make stop in its "
                "checkout) or give this pipeline another serving.port"
            )
        return True
    with contextlib.suppress(OSError):
        probe = socket.create_connection((host, port), timeout=1.0)
        probe.close()
        raise DeployError(
            f"{host}:{port} is in use by something that is not a model server: stop what "
            "listens there, or give this pipeline another serving.port"
        )
    return False


def ensure_local_server(
    serving_root: Path, host: str = "127.0.0.1", port: int = 8501, timeout_s: float = 90.0
) -> int:
    """Start ``python -m trainyard serve`` detached unless a server already answers.

    The process gets its own session (it outlives the caller), its log in
    ``<serving_root>/.server-<port>.log`` and its pid file ``<serving_root>/.server-<port>.pid``
    (one server per port; each serves every model of the root's model config).

    Args:
        serving_root: The base path to serve.
        host: Listen address.
        port: Listen port.
        timeout_s: How long to wait for it to answer.

    Returns:
        The server's pid (from the pid file if one was already running, else 0 when the
        answering server was not started by trainyard).

    Raises:
        DeployError: If the port is taken by something else, or the server exits or does
            not answer in time (with the tail of its log).
    """
    serving_root = Path(serving_root)
    serving_root.mkdir(parents=True, exist_ok=True)
    pid_file = server_pid_file(serving_root, port)
    if _answers(host, port):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            info = read_json(pid_file)
            if info["port"] == port and _alive(int(info["pid"])):
                if "--model-config-file" in info["cmd"]:
                    return int(info["pid"])
                # started by an older trainyard that served the highest version folder:
                # restart it so that it follows the model config (and so the registry)
                stop_local_server(serving_root, port=port)
    if check_port_is_ours(serving_root, host, port):  # answers, not as the pid file's server
        return 0
    plugins_dir = str(Path(trainyard.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugins_dir, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    log_path = serving_root / f".server-{port}.log"
    cmd = [
        sys.executable, "-m", "trainyard", "serve",
        "--base-path", str(serving_root), "--host", host, "--port", str(port),
        "--model-config-file", str(model_config.ensure_config(serving_root)),
        "--poll-interval", "0.5",
    ]  # fmt: skip
    with open(log_path, "ab") as log_fh:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    atomic_write_json(pid_file, {"pid": proc.pid, "host": host, "port": port, "cmd": cmd})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise DeployError(
                f"serving process exited with code {proc.returncode}; log {log_path}:\n"
                + _tail(log_path)
            )
        if _answers(host, port):
            return proc.pid
        time.sleep(0.2)
    proc.terminate()
    pid_file.unlink(missing_ok=True)
    raise DeployError(
        f"serving process did not answer on {host}:{port} within {timeout_s:.0f}s:\n"
        + _tail(log_path)
    )


def _other_trainyard_server(port: int, serving_root: Path) -> tuple[int, str] | None:
    """``(pid, base path)`` of a ``trainyard serve`` on ``port`` serving another root."""
    import psutil

    try:
        listeners = [
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        ]
    except (psutil.Error, OSError):
        return None
    for pid in listeners:
        try:
            cmd = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if "serve" in cmd and "--base-path" in cmd and "trainyard" in " ".join(cmd):
            base = cmd[cmd.index("--base-path") + 1]
            if Path(base).resolve() != serving_root.resolve():
                return pid, base
    return None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return process_alive(pid)


def _is_our_server(pid: int) -> bool:
    return cmdline_has(pid, b"trainyard", b"serve")


def server_pid_file(serving_root: Path, port: int) -> Path:
    """The pid file of the local server on ``port`` (``<serving_root>/.server-<port>.pid``)."""
    return Path(serving_root) / f".server-{port}.pid"


def stop_local_server(
    serving_root: Path, timeout_s: float = 15.0, *, port: int | None = None
) -> bool:
    """Stop the servers :func:`ensure_local_server` started (SIGTERM, then SIGKILL).

    Args:
        serving_root: Their base path.
        timeout_s: How long each may take to exit after SIGTERM.
        port: Only the server on this port (default: every one of the root).

    Returns:
        True if a running server was stopped; False if none was recorded or running.
    """
    root = Path(serving_root)
    if port is not None:
        files = [server_pid_file(root, port)]
    else:  # PID_FILE: the one pid file of servers started before one per port
        files = [*sorted(root.glob(".server-*.pid")), root / PID_FILE]
    stopped = False
    for pid_file in files:
        try:
            pid = int(read_json(pid_file)["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid) and _is_our_server(pid):
            terminate(pid, timeout_s)
            stopped = True
        pid_file.unlink(missing_ok=True)
    return stopped
