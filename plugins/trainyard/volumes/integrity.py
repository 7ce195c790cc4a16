"""Snapshot integrity: the private staging area, verify, damage records, mirror."""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import blake3

from trainyard.errors import SnapshotError
from trainyard.fsutil import (
    HOST,
    atomic_write_json,
    fsync_dir,
    private_tmp_dir,
    publish_dir,
    read_json,
    remove_stale_tmp_dirs,
)
from trainyard.volumes.manifest import (
    Manifest,
    _hash_stream,
    compute_snapshot_id,
    hash_file,
    read_manifest,
)
from trainyard.volumes.paths import (
    DAMAGED,
    HASH_ALGO,
    MANIFEST,
    SNAPSHOT_RE,
    _now,
    snapshot_dir,
    tmp_root,
)

log = logging.getLogger("trainyard.volumes")


@contextmanager
def staging_area(dataset: str, purpose: str, volume_root: Path | None = None) -> Iterator[Path]:
    """A private directory in the dataset's ``.tmp/``, removed on exit unless published.

    Its name records host and pid (``<purpose>-<host>-<pid>-<uuid>``) so a later run can
    tell the residue of a dead process from the work of a live one.
    """
    with private_tmp_dir(tmp_root(dataset, volume_root), prefix=f"{purpose}-") as tmp:
        yield tmp


def clean_stale_tmp(dataset: str, volume_root: Path | None = None) -> list[str]:
    """Remove ``.tmp/`` entries left by dead processes (e.g. a staging run killed -9).

    Entries of this host are removed when their pid is dead; entries of other hosts (pods
    sharing the volume) only when older than a day.

    Returns:
        The names removed.
    """
    return remove_stale_tmp_dirs(tmp_root(dataset, volume_root))


def verify_snapshot(snapshot: Path) -> list[str]:
    """Re-hash every shard of a snapshot against its manifest.

    Args:
        snapshot: The snapshot directory.

    Returns:
        One line per problem (a shard that vanished, changed size or content, or an
        unexpected extra file); empty when the snapshot is intact.

    Raises:
        SnapshotError: If the manifest itself is missing or corrupt.
    """
    snapshot = Path(snapshot)
    manifest = read_manifest(snapshot)
    problems = []
    for shard in manifest.shards:
        path = snapshot / shard.path
        if not path.is_file():
            problems.append(f"{shard.path}: missing")
            continue
        size = path.stat().st_size
        if size != shard.bytes:
            problems.append(f"{shard.path}: size {size} != manifest {shard.bytes}")
            continue
        if hash_file(path) != shard.hash:
            problems.append(f"{shard.path}: content hash differs from manifest")
    expected = {s.path for s in manifest.shards} | {MANIFEST, DAMAGED}
    for path in sorted(snapshot.rglob("*")):
        rel = path.relative_to(snapshot).as_posix()
        if path.is_file() and rel not in expected and not rel.startswith("validation/"):
            problems.append(f"{rel}: not listed in the manifest")
    if compute_snapshot_id(manifest.kind, manifest.contract_version, manifest.shards) != (
        manifest.snapshot_id
    ):
        problems.append(f"{MANIFEST}: snapshot id does not match the listed shards")
    if problems:
        mark_damaged(snapshot, "; ".join(problems))
    return problems


def check_snapshot(snapshot: Path, *, content: bool = True) -> Manifest:
    """Fail closed unless every shard of a snapshot is exactly what its manifest lists.

    One streaming pass per shard at hashing speed (BLAKE3, memory-mapped, multithreaded):
    each shard is opened without following symbolic links, must be a regular file of the
    listed size, and must hash to the listed digest; the snapshot id must match the listed
    shards. Readers call it before they trust the data (validation, training, evaluation
    and the deploy's smoke test). A damaged snapshot is marked so (:func:`mark_damaged`),
    so the next staging of its interval reads the source again and replaces it.

    Args:
        snapshot: The snapshot directory.
        content: Hash every shard. Without it only the manifest, the id and each shard's
            type and size are checked (a ``stat`` per shard, what staging's reuse does)
            and nothing is marked.

    Returns:
        The manifest, checked.

    Raises:
        SnapshotError: ``snapshot <id> damaged: shard <name>: <what>`` for the first shard
            (in manifest order) that is missing, not a regular file, of another size or
            content; or the manifest is missing, corrupt or lists shards of another id.
    """
    snapshot = Path(snapshot)
    try:
        return _check_snapshot(snapshot, content)
    except SnapshotError as e:
        if content and snapshot.is_dir() and mark_damaged(snapshot, str(e)):
            raise SnapshotError(
                f"{e} (recorded: staging its interval again reads the source and replaces it)"
            ) from e
        raise


def mark_damaged(snapshot: Path, reason: str) -> bool:
    """Record that a reader found a published snapshot damaged (``<snapshot>/damaged.json``).

    Staging its interval then reads the source again instead of reusing the snapshot, and
    replaces the damaged copy (a source listing alone cannot tell a flipped bit). The
    record is written in the dataset's ``.tmp/`` and renamed into place, so a kill leaves
    either no record or a whole one. Best effort: a reader on a read-only mount (a
    training pod) or outside a dataset volume records nothing.

    Args:
        snapshot: A snapshot directory (``<dataset>/snapshots/<id>``).
        reason: What is wrong (the reader's error).

    Returns:
        Whether the record was written.
    """
    snapshot = Path(snapshot)
    if snapshot.parent.name != "snapshots" or not SNAPSHOT_RE.match(snapshot.name):
        return False
    record = {"reason": reason, "at": _now(), "host": HOST, "pid": os.getpid()}
    try:
        with private_tmp_dir(snapshot.parent.parent / ".tmp", prefix="mark-damaged-") as tmp:
            atomic_write_json(tmp / DAMAGED, record)
            os.replace(tmp / DAMAGED, snapshot / DAMAGED)
        fsync_dir(snapshot)
    except OSError as e:
        log.info("cannot record that snapshot %s is damaged: %s", snapshot.name, e)
        return False
    return True


def recorded_damage(snapshot: Path) -> dict[str, Any] | None:
    """What a reader recorded with :func:`mark_damaged`, or None (none recorded)."""
    path = Path(snapshot) / DAMAGED
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"reason": f"unreadable damage record {path}: {e}", "at": None}
    return data if isinstance(data, dict) else {"reason": str(data), "at": None}


def clear_damage(snapshot: Path) -> None:
    """Drop a damage record of a snapshot found intact since (staging re-read its source)."""
    path = Path(snapshot) / DAMAGED
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _check_snapshot(snapshot: Path, content: bool) -> Manifest:
    import stat

    manifest = read_manifest(snapshot)
    sid = manifest.snapshot_id
    if manifest.hash_algo != HASH_ALGO:
        raise SnapshotError(
            f"snapshot {sid} damaged: manifest hash_algo {manifest.hash_algo!r} is not "
            f"{HASH_ALGO!r}"
        )
    if SNAPSHOT_RE.match(snapshot.name) and snapshot.name != sid:
        raise SnapshotError(
            f"snapshot {snapshot.name} damaged: {MANIFEST} describes snapshot {sid}"
        )
    if compute_snapshot_id(manifest.kind, manifest.contract_version, manifest.shards) != sid:
        raise SnapshotError(f"snapshot {sid} damaged: {MANIFEST}: id does not match its shards")
    for shard in manifest.shards:
        path = snapshot / shard.path
        damaged = f"snapshot {sid} damaged: shard {shard.path}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise SnapshotError(f"{damaged}: cannot open {path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SnapshotError(f"{damaged}: {path} is not a regular file")
            if st.st_size != shard.bytes:
                raise SnapshotError(
                    f"{damaged}: {st.st_size} bytes, the manifest lists {shard.bytes}"
                )
            if not content:
                continue
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            if st.st_size:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                    h.update(mm)
            if h.hexdigest() != shard.hash:
                raise SnapshotError(
                    f"{damaged}: content hash differs from the manifest "
                    f"({HASH_ALGO} {h.hexdigest()[:16]}..., listed {shard.hash[:16]}...)"
                )
        except OSError as e:
            raise SnapshotError(f"{damaged}: cannot read {path}: {e.strerror}") from None
        finally:
            os.close(fd)
    return manifest


def _verify_remote(fs: Any, base: str, manifest: Manifest) -> list[str]:
    problems = []
    for shard in manifest.shards:
        path = f"{base}/{shard.path}"
        if not fs.exists(path):
            problems.append(f"{path}: missing")
            continue
        with fs.open(path, "rb") as fh:
            digest = _hash_stream(fh)
        if digest != shard.hash:
            problems.append(f"{path}: content hash differs from manifest")
    return problems


def mirror_snapshot(dataset: str, snapshot_id: str, target: str) -> str:
    """Copy a snapshot to a second volume root (path) or an fsspec URL, then verify the copy.

    A local target gets the same atomic publish as staging (``.tmp/`` then rename). A remote
    target (object store) receives the shards first and ``manifest.json`` last, so a
    manifest there means a complete copy.

    Args:
        dataset: The dataset name.
        snapshot_id: The snapshot to copy.
        target: A directory (another volume root), ``file://`` URL or any fsspec URL.

    Returns:
        The location of the verified copy.

    Raises:
        SnapshotError: If the source snapshot is broken or the copy does not verify.
    """
    import fsspec

    src = snapshot_dir(dataset, snapshot_id)
    problems = verify_snapshot(src)
    if problems:
        raise SnapshotError(f"{src}: will not mirror a damaged snapshot: " + "; ".join(problems))
    manifest = read_manifest(src)
    fs, root = fsspec.core.url_to_fs(target)
    if "file" in fs.protocol or "local" in fs.protocol:
        target_root = Path(root)
        final = snapshot_dir(dataset, snapshot_id, target_root)
        if not final.is_dir():
            clean_stale_tmp(dataset, target_root)
            with staging_area(dataset, "mirror", target_root) as tmp:
                for shard in [*manifest.shards, None]:
                    rel = shard.path if shard else MANIFEST
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src / rel, tmp / rel)
                publish_dir(tmp, final)
        problems = verify_snapshot(final)
        where = str(final)
    else:
        base = f"{root.rstrip('/')}/{dataset}/snapshots/{snapshot_id}"
        if not fs.exists(f"{base}/{MANIFEST}"):
            for shard in manifest.shards:
                fs.makedirs(f"{base}/{shard.path}".rsplit("/", 1)[0], exist_ok=True)
                fs.put_file(str(src / shard.path), f"{base}/{shard.path}")
            fs.put_file(str(src / MANIFEST), f"{base}/{MANIFEST}")
        with fs.open(f"{base}/{MANIFEST}", "rb") as fh:
            remote = Manifest.from_dict(json.loads(fh.read()))
        problems = _verify_remote(fs, base, remote)
        if remote.snapshot_id != snapshot_id:
            problems.append(f"{base}/{MANIFEST}: holds snapshot {remote.snapshot_id}")
        where = fs.unstrip_protocol(base)
    if problems:
        raise SnapshotError(f"mirror {where} does not verify: " + "; ".join(problems))
    return where
