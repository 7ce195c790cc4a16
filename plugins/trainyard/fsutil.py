"""Atomic file-system primitives shared by every stage.

Readers only ever see complete files and directories: writers fill a private temporary
path on the same file system, fsync it, then rename it into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename inside it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Fsync every file and directory below ``root`` (before publishing it)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def new_file_mode() -> int:
    """The mode a file created now gets: ``0o666`` less the process's umask.

    trainyard's processes run with umask 077 (``scripts/env.sh``, ``python -m trainyard``):
    owner-only. On a cluster every pod runs as one user (the profile's ``security``).
    """
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600 whatever the umask: give it what a new file gets
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    )


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))


HOST = "".join(c for c in socket.gethostname() if c.isalnum())[:32] or "host"
FOREIGN_TMP_MAX_AGE_S = 24 * 3600


def process_alive(pid: int) -> bool:
    """Whether a process with this pid runs here; a zombie counts as gone.

    A zombie child of ours is reaped; another process's (its parent still running and
    not waiting for it) has exited all the same.
    """
    if not pid_alive(pid):
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return True  # no /proc: pid_alive's answer
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]  # after "(comm) "
        return state not in (b"Z", b"X")
    return done == 0


def cmdline_has(pid: int, *words: bytes) -> bool:
    """Whether the process's command line (``/proc/<pid>/cmdline``) has every word."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return all(w in cmdline for w in words)


def terminate(pid: int, timeout_s: float, *, group: bool = False) -> None:
    """SIGTERM a process, wait up to ``timeout_s``, then SIGKILL it (its group) and wait.

    Args:
        pid: The process (a session leader when ``group``).
        timeout_s: Grace period for a clean exit.
        group: SIGKILL its whole process group, children included.
    """
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
        while process_alive(pid):
            time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def private_tmp_dir(parent: Path, prefix: str = "w-") -> Iterator[Path]:
    """A fresh ``<prefix><host>-<pid>-<uuid>`` directory under ``parent``.

    It is removed on exit unless it was published (renamed away). The name lets
    :func:`remove_stale_tmp_dirs` tell a dead writer's leftovers from live work.
    """
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f"{prefix}{HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)


def remove_stale_tmp_dirs(
    parent: Path, prefix: str = "", foreign_max_age_s: float = FOREIGN_TMP_MAX_AGE_S
) -> list[str]:
    """Remove entries of ``parent`` left by writers that died (e.g. killed -9).

    An entry of this host is stale when its pid is gone; one of another host (another pod
    on the shared volume) or with an unknown name only when older than
    ``foreign_max_age_s``, since its pid cannot be checked from here.

    Args:
        parent: A folder of :func:`private_tmp_dir` entries.
        prefix: Only entries whose names start with it are considered.
        foreign_max_age_s: Age after which an uncheckable entry counts as stale.

    Returns:
        The names removed.
    """
    if not parent.is_dir():
        return []
    removed = []
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix):
            continue
        parts = entry.name[len(prefix) :].rsplit("-", 2)
        try:
            if len(parts) == 3 and parts[0].split("-")[-1] == HOST and parts[1].isdigit():
                pid = int(parts[1])
                stale = pid != os.getpid() and not pid_alive(pid)
            else:
                stale = time.time() - entry.lstat().st_mtime > foreign_max_age_s
        except FileNotFoundError:
            continue
        if stale:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def publish_dir(tmp: Path, final: Path) -> bool:
    """Fsync ``tmp`` and rename it to ``final`` (same file system).

    Args:
        tmp: A complete directory, private to this writer.
        final: Where readers expect it.

    Returns:
        True if this call published ``final``; False if another writer already had (then
        ``tmp`` is removed and the existing directory is left untouched).
    """
    fsync_tree(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if final.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        raise
    fsync_dir(final.parent)
    return True


def read_parquet(path: str | Path, columns: Sequence[str]) -> Any:
    """Columns of one Parquet file as a ``pyarrow.Table``, as ``pq.read_table`` reads them.

    ``pq.read_table`` imports ``pyarrow.dataset``, 0.3-0.6 s of a step's start-up for one
    file: this reads through ``pq.ParquetFile``, which skips a column the file lacks, so a
    missing one is refused here as ``read_table`` refuses it.

    Args:
        path: The Parquet file.
        columns: The columns, in the order wanted.

    Returns:
        The table.

    Raises:
        pyarrow.ArrowInvalid: If the file is not Parquet or lacks a column.
        FileNotFoundError: If there is no such file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as f:
        if missing := [c for c in columns if c not in f.schema_arrow.names]:
            raise pa.ArrowInvalid(f"No match for FieldRef.Name({missing[0]}) in {path}")
        return f.read(columns=list(columns))


#: Most nodes a YAML document may expand to when its aliases are followed.
YAML_MAX_NODES = 100_000


class YAMLTooLarge(yaml.YAMLError):
    """A YAML document whose aliases expand beyond :data:`YAML_MAX_NODES` (or recurse)."""


def _expanded_nodes(root: yaml.Node, limit: int) -> int | None:
    """Nodes of the document with every alias followed, or None past ``limit`` or a cycle.

    Counted bottom-up once per distinct node (an anchored node shared by many aliases is
    counted as often as it is used), so a "billion laughs" document costs its own size.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            size[key] = 1
            continue
        if done:
            on_path.discard(key)
            total = 1 + sum(size[id(c)] for c in children)
            if total > limit:
                return None
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            return None
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
        if any(id(c) in on_path for c in children):
            return None
    return size[id(root)]


def load_yaml(text: str, source: str | Path | None = None, max_nodes: int = YAML_MAX_NODES) -> Any:
    """Parse YAML safely (no object construction), with libyaml's C parser when present.

    The C parser is ~10x faster, which keeps DAG parsing of pipeline configs cheap. The
    document is composed first and refused when its aliases expand to more than
    ``max_nodes`` nodes or refer to themselves ("billion laughs": a few lines of nested
    aliases that expand to gigabytes in any consumer that walks the data).

    Args:
        text: The YAML document.
        source: Where it came from (named in the error).
        max_nodes: Bound on the expanded node count.

    Returns:
        The data (None for an empty document).

    Raises:
        YAMLTooLarge: A ``yaml.YAMLError`` naming ``source``, for an alias bomb.
        yaml.YAMLError: For invalid YAML.
    """
    return load_yaml_indexed(text, source, max_nodes, index=False)[0]


def load_yaml_indexed(
    text: str,
    source: str | Path | None = None,
    max_nodes: int = YAML_MAX_NODES,
    *,
    index: bool = True,
) -> tuple[Any, dict[tuple[Any, ...], int], list[tuple[Any, ...]]]:
    """:func:`load_yaml` and :func:`yaml_line_index` of one document, composed once.

    Args:
        text: The YAML document.
        source: Where it came from (named in the error).
        max_nodes: Bound on the expanded node count.
        index: Also map key paths to lines (False: empty map and list).

    Returns:
        ``(data, lines, duplicates)``: the data, key path → line, key paths given twice.

    Raises:
        YAMLTooLarge: A ``yaml.YAMLError`` naming ``source``, for an alias bomb.
        yaml.YAMLError: For invalid YAML.
    """
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    lines: dict[tuple[Any, ...], int] = {}
    duplicates: list[tuple[Any, ...]] = []
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines, duplicates
        if _expanded_nodes(node, max_nodes) is None:
            where = f"{source}: " if source is not None else ""
            raise YAMLTooLarge(
                f"{where}refused: YAML aliases (&anchor / *alias) expand to more than "
                f"{max_nodes} nodes or refer to themselves"
            )
        if index:
            _index_lines(node, lines, duplicates)
        try:
            return loader.construct_document(node), lines, duplicates
        except ValueError:
            _raise_bad_timestamp(loader, node)
            raise
    finally:
        loader.dispose()


def _raise_bad_timestamp(loader: Any, root: Any) -> None:
    """Raise a YAML error at the unquoted date that is no calendar day (``2026-11-31``).

    PyYAML reads such a scalar as a timestamp and fails with a bare ``ValueError`` (no
    line, no value), which escaped every caller that handles ``yaml.YAMLError``.
    """
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:timestamp":
                try:
                    loader.construct_yaml_timestamp(node)
                except ValueError as e:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"{node.value} is no calendar date ({e})",
                        node.start_mark,
                    ) from None
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in node.value for item in pair)


SECRET_KEY_RE = re.compile(
    r"(?i)^(.*token.*|.*secret.*|.*passw(or)?d.*|.*signature.*|.*credential.*|sig|key|"
    r"api[-_]?key|access[-_]?key.*|auth.*|code|sas|se|sp|sv|x-amz-.*|x-goog-.*)$"
)


def redact_url(url: str) -> str:
    """A URL fit to store or print: its secrets replaced by ``***``.

    Masked: the whole user info (``user:password@`` or a bare token), whatever characters
    the secret holds (a ``/``, ``#``, ``?`` or ``@`` in it, as in about half of real AWS
    secret keys, used to end the masking early), and secret-looking query parameters
    (``token``, ``sig``, ``X-Amz-Signature``, ...).

    Credentials belong in an Airflow connection (``source.conn_id``), never in the URL
    text: ``pipelines check`` refuses them there; this keeps them out of manifests, logs
    and errors wherever a URL still carries one.

    Args:
        url: Any URL or path.

    Returns:
        The URL with secrets masked (a plain path is returned unchanged).
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    if "://" not in url and "?" not in url and "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")
    if sep and at and _is_userinfo(userinfo):
        url, rest = f"{scheme}://***@{after}", after
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(SECRET_KEY_RE.match(k) for k, _ in pairs):
            query = urlencode(
                [(k, "***" if SECRET_KEY_RE.match(k) else v) for k, v in pairs], safe="*/:"
            )
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def _is_userinfo(text: str) -> bool:
    """Whether what a URL holds before its last ``@`` is credentials, not a path.

    ``user:secret`` (the secret may hold any character) or a bare token; a path with an
    ``@`` in a later segment (``bucket/me@example.com/x``) has a ``/`` and no ``:``.
    """
    return bool(text) and text != "***" and (":" in text or "/" not in text)


def url_credentials(url: str) -> str | None:
    """The user info a URL carries (``user:secret`` or a token), masked; None without.

    ``pipelines check`` refuses a source URL that carries any: credentials go in an
    Airflow connection.
    """
    _, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    return redact_url(url) if sep and at and _is_userinfo(userinfo) else None


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` fit to print: every URL masked (:func:`redact_url`), every known secret too.

    Args:
        text: A message, e.g. a storage library's error, which may quote a secret without
            its URL (botocore names an "invalid bucket" made of credentials).
        secrets: Values to mask wherever they appear (a connection's password).

    Returns:
        The text with ``***`` for each secret.
    """
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def yaml_line_index(text: str) -> tuple[dict[tuple[Any, ...], int], list[tuple[Any, ...]]]:
    """Map each key path of a YAML document to its 1-based line; list duplicated keys.

    Args:
        text: The YAML text (composed, not constructed: no aliases are expanded).

    Returns:
        ``(lines, duplicates)``: key path → line, and the key paths given twice.

    Raises:
        yaml.YAMLError: If the text is not YAML.
    """
    lines: dict[tuple[Any, ...], int] = {}
    duplicates: list[tuple[Any, ...]] = []
    root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if root is not None:
        _index_lines(root, lines, duplicates)
    return lines, duplicates


def _index_lines(
    root: yaml.Node, lines: dict[tuple[Any, ...], int], duplicates: list[tuple[Any, ...]]
) -> None:
    def walk(node: yaml.Node, path: tuple[Any, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key, value in node.value:
                sub = (*path, key.value)
                if key.value in seen:
                    duplicates.append(sub)
                seen.add(key.value)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    walk(root, ())


class YamlWhere:
    """Formats ``file:line: field: message`` for a key path of the document."""

    def __init__(self, path: Path, lines: dict[tuple[Any, ...], int]) -> None:
        self.path = path
        self.lines = lines

    def __call__(self, keys: Sequence[Any], message: str) -> str:
        """``file:line: dotted.key: message`` for the nearest key path that has a line."""
        keys = tuple(keys)
        line = None
        for n in range(len(keys), -1, -1):
            if keys[:n] in self.lines:
                line = self.lines[keys[:n]]
                break
        where = f"{self.path}:{line}" if line else str(self.path)
        dotted = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")
        return f"{where}: {dotted or '<root>'}: {message}"


def check_files(
    files: Sequence[Path],
    check: Callable[[Path], Any],
    describe: Callable[[Any], str],
    error: type[Exception],
    kind: str,
) -> int:
    """Check each file, print ``ok   <file> (...)`` or ``FAIL <error>``; the exit code.

    Args:
        files: The files (in order).
        check: Parses and checks one file; raises ``error`` when it is invalid.
        describe: What to say of a valid one (in the parentheses).
        error: The exception that means "invalid" (anything else propagates).
        kind: What the files are, for the closing count (``contract``, ``pipeline``).

    Returns:
        0 if every file is valid, else 1.
    """
    import sys

    failed = 0
    for path in files:
        try:
            checked = check(path)
        except error as e:
            failed += 1
            sys.stderr.write(f"FAIL {e}\n")
        else:
            sys.stdout.write(f"ok   {path} ({describe(checked)})\n")
    if failed:
        sys.stderr.write(f"{failed} of {len(files)} {kind}(s) invalid\n")
    return 1 if failed else 0
