"""Model registry on the models volume: numbered versions, a champion pointer, lineage.

Layout of one pipeline's registry (``<models_root>/<pipeline>/``)::

    versions/<n>/model/          the SavedModel, copied at registration
    versions/<n>/metadata.json   lineage: snapshot, dataset, contract, config hash, code, image
    versions/<n>/metrics.json    training metrics
    versions/<n>/gate.{md,json}  the evaluation gate's decision (attached after evaluation)
    champion.json                {"version": n, "previous": [...], "event": {...}}
    history.jsonl                one JSON line per promotion, rollback or approval
    .tmp/                        private in-progress copies, never read
    .lock                        ``flock`` serialising numbering and pointer moves
    .mirror.lock                 ``flock`` held while mirroring into a tracker (trainyard.tracking)
    .deploy.lock                 ``flock`` held by a deploy, promote or rollback (serving too)
    scores/<digest>.json         a version's scores on a holdout, keyed by their fingerprint
                                 (a cache the gate fills and reads; removing it costs time only)

A version directory appears only complete (copied into ``.tmp``, fsynced, renamed), and the
champion pointer is replaced atomically and only ever names a published version, so a crash
at any point leaves the previous champion in place. ``champion.json`` carries the stack of
earlier champions that ``rollback`` pops, and the event that set it; an event whose history
line was lost to a crash is appended the next time the registry is changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainyard import __version__, argtypes
from trainyard.errors import RegistryError, RegistryRefused
from trainyard.fsutil import (
    atomic_write_bytes,
    atomic_write_json,
    fsync_dir,
    private_tmp_dir,
    publish_dir,
    read_json,
    remove_stale_tmp_dirs,
)
from trainyard.layout import CHAMPION_FILE, HISTORY_FILE, SCORES_DIR, VERSIONS_DIR

#: Files a caller may attach to a published version (written atomically, never the model).
ATTACHABLE = ("gate.md", "gate.json", "approval.json")
MAX_REASON_CHARS = 2000
"""The longest ``--reason`` the CLI records (every history reader shows it)."""
#: Metadata keys every version must carry (the lineage of the model).
REQUIRED_METADATA = ("dataset", "snapshot_id")
_TMP_PREFIX = "reg-"
_FOREIGN_TMP_AGE_S = 24 * 3600

log = logging.getLogger("trainyard.registry")


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    """A history event: a fresh id, its kind, its fields, and when."""
    return {"id": uuid.uuid4().hex, "event": kind, **fields, "at": _now()}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _read_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; anything else is a ``RegistryError`` naming the file."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as e:
        raise RegistryError(f"{path}: unreadable {what}: {e}") from e
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: {what} is not a JSON object")
    return data


class Registry:
    """The versions of one pipeline's model and which of them is the champion."""

    def __init__(self, models_root: Path | str, pipeline: Any) -> None:
        """Open (lazily create) the registry of ``pipeline`` below ``models_root``.

        Args:
            models_root: Root of the models volume (``Settings.models_root``).
            pipeline: Pipeline name, or an object with a ``name`` (a ``PipelineConfig``).

        Raises:
            RegistryError: If the pipeline name could escape the models volume.
        """
        name = str(getattr(pipeline, "name", pipeline))
        if not name or "/" in name or name.startswith(".") or name != name.strip():
            raise RegistryError(f"invalid pipeline name {name!r} for the model registry")
        self.pipeline = name
        self.root = Path(models_root) / name
        self.versions_root = self.root / VERSIONS_DIR
        self.pointer = self.root / CHAMPION_FILE
        self.history_path = self.root / HISTORY_FILE
        self._tmp_root = self.root / ".tmp"

    # ----------------------------------------------------------------- locking + hygiene

    @contextmanager
    def deploy_lock(self) -> Iterator[None]:
        """Hold ``.deploy.lock``: one deploy, promote or rollback of the pipeline at a time.

        Each reads the champion, changes what is served and moves the pointer; two at once
        left the registry naming one champion and the server serving another (a deploy
        that failed restored the champion it had read before the other's promotion).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".deploy.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("%s: waiting for another deploy, promote or rollback", self.pipeline)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self, strict: bool = True) -> Iterator[None]:
        """Hold the registry lock; ``strict=False`` tolerates an unreadable pointer."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._reconcile_history()
            except RegistryError:
                if strict:
                    raise
                log.warning("registry %s: champion pointer unreadable", self.root, exc_info=True)
            yield
        finally:
            os.close(fd)

    def _clean_stale_tmp(self) -> None:
        """Remove in-progress copies (``reg-<host>-<pid>-<uuid>``) left by writers that died."""
        remove_stale_tmp_dirs(self._tmp_root, _TMP_PREFIX, _FOREIGN_TMP_AGE_S)

    # ----------------------------------------------------------------- versions

    def version_dir(self, version: int) -> Path:
        """The directory of a published version.

        Args:
            version: Version number.

        Returns:
            ``versions/<n>`` (holding ``model/``, ``metadata.json``, ``metrics.json``).

        Raises:
            RegistryError: If the version does not exist.
        """
        path = self.versions_root / str(int(version))
        if not (path / "metadata.json").is_file():
            raise RegistryRefused(
                f"pipeline {self.pipeline!r} has no version {version} (looked in {path}; "
                f"known: {self.list_versions() or 'none'})"
            )
        return path

    def list_versions(self) -> list[int]:
        """Published version numbers, ascending."""
        if not self.versions_root.is_dir():
            return []
        return sorted(int(p.name) for p in self.versions_root.iterdir() if p.name.isdigit())

    def metadata(self, version: int) -> dict[str, Any]:
        """The lineage metadata of a version (``metadata.json``).

        Args:
            version: Version number.

        Returns:
            The metadata, including ``version``, ``pipeline`` and ``registered_at``.

        Raises:
            RegistryError: If the version is missing or its metadata unreadable.
        """
        return _read_object(self.version_dir(version) / "metadata.json", "version metadata")

    def read_file(self, version: int, name: str) -> dict[str, Any] | None:
        """A JSON file of a version (``metrics.json``, ``gate.json``), or None if absent.

        Raises:
            RegistryError: If the file exists but is not a JSON object.
        """
        path = self.version_dir(version) / name
        return _read_object(path, name) if path.is_file() else None

    def register(
        self,
        model_dir: Path | str,
        metadata: Mapping[str, Any],
        extra_files: Sequence[Path | str] = (),
    ) -> int:
        """Copy a SavedModel in as the next numbered version, atomically.

        The model and the sibling files are copied into a private ``.tmp`` directory outside
        the lock; the number is then assigned under the registry lock and the directory is
        fsynced and renamed to ``versions/<n>``. Concurrent registrations get distinct,
        consecutive numbers; a crash leaves no visible version.

        Args:
            model_dir: A SavedModel directory (with ``saved_model.pb``).
            metadata: Lineage (must hold ``dataset`` and ``snapshot_id``; typically also
                ``contract_version``, ``config_hash``, ``code_version``, ``image``,
                ``training``, ``train_metrics``, ``timings``). ``version``, ``pipeline`` and
                ``registered_at`` are added, and ``code_version`` when it is missing.
            extra_files: Sibling files or folders copied next to ``model/`` under their
                own names (``metrics.json``, ``history.json``, ``tensorboard/``). Without a
                ``metrics.json`` one is written from ``metadata["train_metrics"]`` (or ``{}``).

        Returns:
            The new version number.

        Raises:
            RegistryError: If the model directory is not a SavedModel, metadata lacks
                lineage or is not JSON-serialisable, or an extra file is missing.
        """
        src = Path(model_dir)
        if not (src / "saved_model.pb").is_file():
            raise RegistryError(f"{src}: not a SavedModel directory (no saved_model.pb)")
        missing = [k for k in REQUIRED_METADATA if not metadata.get(k)]
        if missing:
            raise RegistryError(f"version metadata for {src} lacks {', '.join(missing)}")
        if not metadata.get("code_version"):
            metadata = {**metadata, "code_version": code_version()}
        extras = [Path(p) for p in extra_files]
        for path in extras:
            if not (path.is_file() or path.is_dir()):
                raise RegistryError(f"{path}: extra file to register does not exist")
            if path.name in ("metadata.json", "model", *ATTACHABLE):
                raise RegistryError(f"{path}: extra file name {path.name!r} is reserved")
        try:
            json.dumps(dict(metadata), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise RegistryError(f"version metadata for {src} is not plain JSON: {e}") from e

        with private_tmp_dir(self._tmp_root, prefix=_TMP_PREFIX) as tmp:
            shutil.copytree(src, tmp / "model")
            for path in extras:
                if path.is_dir():
                    shutil.copytree(path, tmp / path.name, symlinks=True)
                else:
                    shutil.copy2(path, tmp / path.name)
            if not (tmp / "metrics.json").exists():
                metrics = metadata.get("train_metrics") or metadata.get("metrics") or {}
                _write_plain_json(tmp / "metrics.json", metrics)
            with self._locked(strict=False):
                self._clean_stale_tmp()
                version = self._next_version()
                meta = {
                    **dict(metadata),
                    "version": version,
                    "pipeline": self.pipeline,
                    "registered_at": _now(),
                }
                _write_plain_json(tmp / "metadata.json", meta)
                if not publish_dir(tmp, self.versions_root / str(version)):
                    raise RegistryError(f"version {version} appeared while the lock was held")
        return version

    def _next_version(self) -> int:
        used = set(self.list_versions())
        try:
            state = self._read_pointer()
        except RegistryError:
            state = None  # numbering never depends on a readable pointer
        if state:
            used.update(v for v in [state.get("version"), *state.get("previous", [])] if v)
        return max(used, default=0) + 1

    def attach(self, version: int, name: str, data: bytes | str) -> Path:
        """Write a report file (``gate.md`` or ``gate.json``) into a published version.

        Args:
            version: Version number.
            name: One of ``ATTACHABLE``.
            data: File content.

        Returns:
            The written path.

        Raises:
            RegistryError: If the version is missing or the name is not attachable.
        """
        if name not in ATTACHABLE:
            raise RegistryError(f"cannot attach {name!r} to a version (allowed: {ATTACHABLE})")
        path = self.version_dir(version) / name
        atomic_write_bytes(path, data.encode() if isinstance(data, str) else data)
        return path

    def cached_scores(self, digest: str) -> dict[str, Any] | None:
        """Scores kept under a fingerprint's digest (:meth:`keep_scores`), or None.

        A file that does not read as a JSON object is as good as none: scoring again
        replaces it.
        """
        path = self.root / SCORES_DIR / f"{digest}.json"
        try:
            data = read_json(path)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def keep_scores(self, digest: str, scores: Mapping[str, Any]) -> None:
        """Keep a version's scores on a holdout under their fingerprint's digest (atomic).

        Raises:
            RegistryError: If the digest is not hex (it names a file).
        """
        if not digest or not all(c in "0123456789abcdef" for c in digest):
            raise RegistryError(f"scores digest {digest!r} is not hex")
        folder = self.root / SCORES_DIR
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / f"{digest}.json", dict(scores))

    # ----------------------------------------------------------------- champion pointer

    def _read_pointer(self) -> dict[str, Any] | None:
        if not self.pointer.exists():
            return None
        try:
            state = read_json(self.pointer)
        except (OSError, ValueError) as e:
            raise RegistryError(f"{self.pointer}: unreadable champion pointer: {e}") from e
        if (
            not isinstance(state, dict)
            or not (state.get("version") is None or isinstance(state.get("version"), int))
            or not isinstance(state.get("previous", []), list)
        ):
            raise RegistryError(f"{self.pointer}: malformed champion pointer {state!r}")
        return state

    def champion(self) -> int | None:
        """The current champion version, or None before the first promotion.

        Raises:
            RegistryError: If ``champion.json`` is unreadable or names a missing version.
        """
        state = self._read_pointer()
        version = state.get("version") if state else None
        if version is None:
            return None
        if not (self.versions_root / str(version) / "metadata.json").is_file():
            raise RegistryError(
                f"{self.pointer}: champion names version {version}, which is missing"
            )
        return version

    def champion_state(self) -> dict[str, Any] | None:
        """The whole pointer: ``version``, ``previous`` (rollback stack), ``event``."""
        return self._read_pointer()

    def served_versions(self) -> list[int]:
        """Every version that was ever the champion (promoted or rolled back to), ascending.

        Raises:
            RegistryError: If the history or the champion pointer does not read.
        """
        served = {
            e["version"]
            for e in self.history()
            if e.get("event") in ("promote", "rollback") and isinstance(e.get("version"), int)
        }
        champion = self.champion()
        if champion is not None:
            served.add(champion)
        return sorted(served)

    def history(self) -> list[dict[str, Any]]:
        """Every promotion and rollback, oldest first (from ``history.jsonl``).

        Raises:
            RegistryError: If a line is not JSON (names the line number).
        """
        if not self.history_path.exists():
            return []
        events = []
        for i, line in enumerate(self.history_path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError as e:
                raise RegistryError(f"{self.history_path}:{i}: not a JSON line: {e}") from e
        return events

    def record_approval(
        self, version: int, approved: bool | None, actor: str, reason: str, **extra: Any
    ) -> dict[str, Any]:
        """Record a person's answer about a version (``approval.json`` + history).

        Args:
            version: The version asked about.
            approved: Their answer; None: asked (again) and not answered yet, which
                withdraws any earlier answer.
            actor: Who answered (``timeout`` when nobody did in time).
            reason: What they wrote (may be empty).
            **extra: Recorded alongside (``run_id``, ``at``).

        Returns:
            The event recorded.

        Raises:
            RegistryError: If the version does not exist.
        """
        version = int(version)
        event = _event(
            "approval", approved=approved, version=version, actor=actor, reason=reason, **extra
        )
        with self._locked():
            self.version_dir(version)
            self.attach(version, "approval.json", json.dumps(event, indent=2))
            self._append_history(event)
        return event

    def approval_answer(self, version: int) -> dict[str, Any]:
        """The answer held for a version's approval request, as a run's record shows it.

        Returns:
            ``approved`` (None: waiting, or never asked), ``by``, ``reason``, ``at``.
        """
        try:
            answer = self.read_file(version, "approval.json") or {}
        except RegistryError:  # no such version (any more): nothing was answered for it
            answer = {}
        waiting = answer.get("approved") is None
        return {
            "approved": answer.get("approved"),
            "by": None if waiting else answer.get("actor"),
            "reason": "waiting" if waiting else answer.get("reason") or "",
            "at": answer.get("at"),
        }

    def _append_history(self, event: Mapping[str, Any]) -> None:
        line = (json.dumps(dict(event), sort_keys=True) + "\n").encode()
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)

    def _reconcile_history(self) -> None:
        """Append the pointer's event if a crash lost it after the pointer moved."""
        state = self._read_pointer() if self.pointer.exists() else None
        event = (state or {}).get("event")
        if not event:
            return
        if self.history_path.exists():
            with self.history_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 65536))
                tail = fh.read().decode("utf-8", errors="replace").splitlines()
            if any(f'"id": "{event["id"]}"' in line for line in tail):
                return
        self._append_history(event)

    def _move_pointer(
        self, version: int | None, previous: list[int], event: dict[str, Any]
    ) -> None:
        atomic_write_json(self.pointer, {"version": version, "previous": previous, "event": event})
        self._append_history(event)

    def promote(self, version: int, reason: str, actor: str, forced: bool = False) -> bool:
        """Make ``version`` the champion (atomically) and record who, when and why.

        A version whose attached gate decision is ``reject`` can only be promoted with
        ``forced=True``. The promotion is recorded as forced when it overrides that
        rejection or the gate's verdict is ``forced`` (a forced run); ``forced=True`` over
        a gate that passed overrides nothing and is not recorded as forced.
        The champion itself is not promoted again: nothing is recorded.

        Args:
            version: A published version.
            reason: Why (one sentence; required).
            actor: Who (a user name or ``pipeline``; required).
            forced: Override a gate that rejected the version.

        Returns:
            False if ``version`` already was the champion (nothing written).

        Raises:
            RegistryError: If the version is missing, reason/actor are empty, or the gate
                rejected it and ``forced`` is false.
        """
        if not reason.strip() or not actor.strip():
            raise RegistryError("promote needs a non-empty reason and actor")
        version = int(version)
        with self._locked():
            self.version_dir(version)
            gate = self.read_file(version, "gate.json")
            verdict = (gate or {}).get("verdict")
            if verdict == "reject" and not forced:
                raise RegistryRefused(
                    f"version {version} was rejected by its gate ({(gate or {}).get('reason')}); "
                    "promote it with forced=True (CLI: --force) and a reason to override"
                )
            # --force over a gate that passed overrides nothing: not recorded as forced
            forced = (forced and verdict == "reject") or verdict == "forced"
            state = self._read_pointer() or {}
            current = state.get("version")
            if current == version:
                return False
            previous = list(state.get("previous", []))
            if current is not None:
                previous.append(current)
            event = _event(
                "promote",
                version=version,
                **{"from": current},
                actor=actor,
                reason=reason,
                forced=forced,
            )
            if forced and gate and gate.get("force"):
                event["force_request"] = gate["force"]
            self._move_pointer(version, previous, event)
        return True

    def rollback(self, reason: str, actor: str, *, unserve: bool = False) -> int | None:
        """Make the previous champion the champion again.

        Args:
            reason: Why (required).
            actor: Who (required).
            unserve: Allow rolling back the first champion, leaving no champion (nothing
                is served then).

        Returns:
            The new champion, or None if the rolled-back version was the first champion
            (then no version is champion any more).

        Raises:
            RegistryError: If there is no champion, the previous one is missing, or the
                champion is the first one and ``unserve`` is not set.
        """
        if not reason.strip() or not actor.strip():
            raise RegistryError("rollback needs a non-empty reason and actor")
        with self._locked():
            state = self._read_pointer() or {}
            current = state.get("version")
            if current is None:
                raise RegistryRefused(f"pipeline {self.pipeline!r} has no champion to roll back")
            previous = list(state.get("previous", []))
            if not previous and not unserve:
                raise RegistryRefused(
                    f"version {current} is the first champion of {self.pipeline!r}: rolling it "
                    "back leaves no model to serve; promote another version instead, or pass "
                    "--unserve to take the model offline"
                )
            target = previous.pop() if previous else None
            if target is not None:
                self.version_dir(target)
            event = _event(
                "rollback",
                version=target,
                **{"from": current},
                actor=actor,
                reason=reason,
                forced=False,
            )
            self._move_pointer(target, previous, event)
            return target

    def snapshot_ids_in_use(self, live_only: bool = False) -> set[tuple[str, str]]:
        """The ``(dataset, snapshot_id)`` pairs models of this pipeline were trained on.

        Every snapshot of a version's training window counts (``snapshots`` in its
        metadata), not only its own ``snapshot_id``.

        Args:
            live_only: Only the champion and the versions a rollback could reach.

        Returns:
            The pairs (snapshot garbage collection must keep them).
        """
        versions = self.list_versions()
        if live_only:
            state = self._read_pointer() or {}
            live = {state.get("version"), *state.get("previous", [])}
            versions = [v for v in versions if v in live]
        used = set()
        for v in versions:
            meta = self.metadata(v)
            used.add((str(meta["dataset"]), str(meta["snapshot_id"])))
            for read in meta.get("snapshots") or []:  # the version's training window
                if isinstance(read, dict) and read.get("snapshot_id"):
                    dataset = str(read.get("dataset") or meta["dataset"])
                    used.add((dataset, str(read["snapshot_id"])))
        return used


def snapshots_in_use(models_root: Path, live_only: bool = False) -> set[tuple[str, str]]:
    """``(dataset, snapshot_id)`` pairs referenced by any pipeline's registered models.

    Args:
        models_root: Root of the models volume.
        live_only: See ``Registry.snapshot_ids_in_use``.

    Returns:
        The union over every pipeline registry below ``models_root``.
    """
    used: set[tuple[str, str]] = set()
    if not Path(models_root).is_dir():
        return used
    for entry in sorted(Path(models_root).iterdir()):
        if (entry / VERSIONS_DIR).is_dir():
            used |= Registry(models_root, entry.name).snapshot_ids_in_use(live_only)
    return used


def code_version(project_dir: Path | None = None) -> str:
    """The code's version for lineage: the git commit (``-dirty`` if modified) or the package.

    Args:
        project_dir: The checkout (defaults to the configured project dir).

    Returns:
        ``<40-hex sha>[-dirty]``, or ``trainyard <version>`` outside a git checkout.
    """
    from trainyard.settings import get_settings

    cwd = str(project_dir or get_settings().project_dir)
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return f"trainyard {__version__}"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return f"trainyard {__version__}"
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _write_plain_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


# --------------------------------------------------------------------- CLI


def format_metrics(
    metrics: Mapping[str, Any] | None, *, sep: str = ", ", limit: int | None = None
) -> str:
    """Metrics as a person reads them: ``accuracy=0.9432, loss=0.1489``.

    Numbers only (a version's training figures also hold class names, model, strategy),
    sorted by name, no per-slice figures (``accuracy@region=eu``), floats to 4 places.

    Args:
        metrics: Name → value.
        sep: Between two metrics.
        limit: At most this many (the first by name).
    """
    items = [
        (k, v)
        for k, v in sorted((metrics or {}).items())
        if "@" not in k and isinstance(v, int | float) and not isinstance(v, bool)
    ][:limit]
    return sep.join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in items)


def readable_versions(reg: Registry) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """Every version whose metadata reads, and one line per version whose does not.

    One corrupt ``metadata.json`` must not hide the other versions: it is skipped and
    reported (named), and logged as a warning.

    Args:
        reg: The registry.

    Returns:
        ``[(version, metadata)]`` ascending, and the problems (``version <n>: <why>``).
    """
    good: list[tuple[int, dict[str, Any]]] = []
    problems: list[str] = []
    for v in reg.list_versions():
        try:
            good.append((v, reg.metadata(v)))
        except RegistryError as e:
            problems.append(f"version {v}: {e}")
            log.warning("registry %s: skipping version %s: %s", reg.root, v, e)
    return good, problems


def _snapshot_cell(meta: Mapping[str, Any]) -> str:
    """A version's snapshot, and how many more its training window read (``+4``)."""
    more = len([s for s in meta.get("snapshots") or [] if isinstance(s, dict)]) - 1
    cell = str(meta.get("snapshot_id", "-"))
    return f"{cell} +{more}" if more > 0 else cell


def _list(reg: Registry) -> str:
    try:
        champion = reg.champion()
    except RegistryError as e:
        champion, pointer_problem = None, [f"champion pointer: {e}"]
    else:
        pointer_problem = []
    rows = [("", "version", "registered", "snapshot", "gate", "metrics")]
    versions, problems = readable_versions(reg)
    problems = pointer_problem + problems
    try:
        served = {e.get("version") for e in reg.history() if e.get("event") != "approval"}
    except RegistryError as e:
        served, problems = None, [*problems, f"history: {e}"]
    for v, meta in versions:
        try:
            gate = reg.read_file(v, "gate.json") or {}
            metrics = gate.get("candidate_metrics") or reg.read_file(v, "metrics.json") or {}
        except RegistryError as e:
            problems.append(f"version {v}: {e}")
            gate, metrics = {}, {}
        rows.append(
            (
                "*" if v == champion else "",
                str(v),
                str(meta.get("registered_at", "-")),
                _snapshot_cell(meta),
                _gate_cell(gate.get("verdict"), served is None or v in served),
                format_metrics(metrics, sep=" "),
            )
        )
    unreadable = "".join(f"unreadable, skipped: {p}\n" for p in problems)
    if len(rows) == 1:
        return f"pipeline {reg.pipeline!r} has no registered versions\n" + unreadable
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n" + unreadable


def _gate_cell(verdict: str | None, ever_champion: bool) -> str:
    """The gate's verdict, ``promote (never served)`` for one that never became champion.

    Its deploy failed, was killed, or waits for a person's approval.
    """
    if verdict == "promote" and not ever_champion:
        return "promote (never served)"
    return verdict or "-"


def caller() -> str:
    """Who acts by hand when no actor is named: the login name, else ``cli``.

    ``USER``, else ``LOGNAME``, else the account of this process's user id (containers
    and cron set neither variable).
    """
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not name:
        import pwd

        try:
            name = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:  # a user id without an account (some containers)
            name = None
    return name or "cli"


def cli_main(
    argv: list[str],
    after_move: Callable[[str], str] | None = None,
    before_move: Callable[[str], None] | None = None,
    answer: Callable[..., dict[str, Any]] | None = None,
) -> int:
    """``python -m trainyard models list|show|promote|rollback|history|serve --pipeline P``.

    Args:
        argv: Arguments after ``models``.
        after_move: Called with the pipeline after a promote, rollback or serve (serving
            follows the champion); its line is printed.
        before_move: Called with the pipeline before a promote or rollback; what it
            raises stops the move before anything is written.
        answer: Records ``approve``/``reject`` (:func:`trainyard.steps.approval`, the one
            writer of an approval), called with pipeline, version, decision, by, reason.

    Returns:
        The exit code (trainyard errors propagate to the dispatcher, which prints them).
    """
    from trainyard.config import NAME_RE
    from trainyard.settings import get_settings

    parser = argtypes.ArgumentParser(prog="python -m trainyard models")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "versions, the champion marked *"),
        ("show", "one version's metadata and gate decision (default: the champion)"),
        ("promote", "make a version the champion"),
        ("rollback", "make the previous champion the champion again"),
        ("approve", "approve a version (pipelines with gate.approval: required)"),
        ("reject", "reject a version (pipelines with gate.approval: required)"),
        ("history", "promotions, rollbacks and approvals, oldest first"),
        ("serve", "serve the champion again (after make stop: starts the model server)"),
    ):
        p = sub.add_parser(action, help=text)
        p.add_argument("--pipeline", required=True)
        if action == "show":
            p.add_argument("version", type=int, nargs="?")
        if action in ("promote", "approve", "reject"):
            p.add_argument("version", type=int)
        if action == "promote":
            p.add_argument("--force", action="store_true", help="override a rejecting gate")
        if action == "rollback":
            p.add_argument(
                "--unserve",
                action="store_true",
                help="allow rolling back the first champion: nothing is served afterwards",
            )
        if action in ("promote", "rollback", "approve", "reject"):
            p.add_argument("--reason", required=True)
            p.add_argument("--actor", default=caller())
    args = parser.parse_args(argv)
    if not NAME_RE.match(args.pipeline):
        parser.error(f"invalid pipeline name {args.pipeline!r}")
    if getattr(args, "reason", None) is not None and not args.reason.strip():
        parser.error("--reason must say why (it is recorded with who and when)")
    if len(getattr(args, "reason", None) or "") > MAX_REASON_CHARS:
        parser.error(
            f"--reason is {len(args.reason)} characters: a reason is a sentence or a few "
            f"(at most {MAX_REASON_CHARS}); link to anything longer"
        )
    settings = get_settings()
    reg = Registry(settings.models_root, args.pipeline)
    configs = {p.stem for p in settings.pipelines_dir.glob("*.yaml")}
    if args.pipeline not in configs and not reg.root.is_dir():
        registered = settings.models_root.iterdir() if settings.models_root.is_dir() else ()
        known = sorted(configs | {p.name for p in registered if p.is_dir()})
        parser.error(
            f"unknown pipeline {args.pipeline!r}: no config in {settings.pipelines_dir} and "
            f"nothing registered (known: {', '.join(known) or 'none'})"
        )
    if args.pipeline not in configs and args.action in ("promote", "rollback", "serve"):
        raise RegistryRefused(
            f"pipeline {args.pipeline!r} has no config in {settings.pipelines_dir}: serving "
            "follows the champion under the config's serving.model_name, so nothing was "
            f"moved or served; put {args.pipeline}.yaml back to {args.action} (models list, "
            "show and history read the registry without it)"
        )
    version = getattr(args, "version", None)
    if version is not None and version not in (known := reg.list_versions()):
        listed = ", ".join(map(str, known)) or "none"
        parser.error(f"pipeline {reg.pipeline!r} has no version {version} (known: {listed})")
    # a move and serving's following it are one step no deploy of the pipeline interleaves
    moving = args.action in ("promote", "rollback", "serve")
    with reg.deploy_lock() if moving else contextlib.nullcontext():
        if args.action == "serve" and reg.champion() is None:
            raise RegistryRefused(f"pipeline {reg.pipeline!r} has no champion to serve")
        if moving and before_move is not None:
            before_move(reg.pipeline)
        out = sys.stdout
        if args.action == "list":
            out.write(_list(reg))
        elif args.action == "show":
            version = args.version if args.version is not None else reg.champion()
            if version is None:
                raise RegistryRefused(f"pipeline {reg.pipeline!r} has no champion; name a version")
            shown = {
                "version": version,
                "champion": version == reg.champion(),
                "path": str(reg.version_dir(version)),
                "metadata": reg.metadata(version),
                "metrics": reg.read_file(version, "metrics.json"),
                "gate": reg.read_file(version, "gate.json"),
            }
            out.write(json.dumps(shown, indent=2, sort_keys=True, default=str) + "\n")
        elif args.action == "promote":
            if reg.promote(args.version, args.reason, args.actor, forced=args.force):
                out.write(f"{reg.pipeline}: version {args.version} is now the champion\n")
            else:
                out.write(f"{reg.pipeline}: version {args.version} already is the champion\n")
        elif args.action in ("approve", "reject"):
            if answer is None:
                raise RegistryRefused("models approve|reject: no approval writer given")
            said = "approved" if args.action == "approve" else "rejected"
            done = answer(reg.pipeline, args.version, said, args.actor, args.reason)
            out.write(f"{reg.pipeline}: version {args.version} {said} by {args.actor}\n")
            if done.get("rolled_back"):
                out.write(f"it was the champion: rolled back; {done.get('served')}\n")
        elif args.action == "rollback":
            target = reg.rollback(args.reason, args.actor, unserve=args.unserve)
            out.write(f"{reg.pipeline}: champion is now {'none' if target is None else target}\n")
        elif args.action == "history":
            for event in reg.history():
                out.write(json.dumps(event, sort_keys=True) + "\n")
        if moving and after_move is not None:
            out.write(after_move(reg.pipeline) + "\n")
    return 0
