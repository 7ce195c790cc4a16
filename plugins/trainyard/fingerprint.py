"""Fingerprints of a step's inputs: when two runs of a step would do the same work.

One helper for every step that reuses earlier work. A step names what its result depends
on (ids, versions, the effective config, the code), :func:`fingerprint` turns that into
a digest, and the step keeps the digest (and the inputs, to say what changed) with what
it made:

* ``stage``: an interval's source listing under the contract's staging terms
  (``source_fingerprint`` of the interval record);
* ``validate``: a snapshot, the contract, the drift baseline and the code
  (``fingerprint`` in the snapshot's ``validation/summary.json``);
* ``train``: the window's snapshot ids, the contract, the training config and its seed,
  the code (:func:`code_identity`), the image and TensorFlow (``fingerprint`` in a
  version's ``metadata.json``);
* ``evaluate``: a version scored on a holdout (the score cache of the registry).

A digest is a BLAKE2b hash of the kind and the inputs as canonical JSON (sorted keys), so
the order in which a step lists its inputs does not matter and any changed value does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DIGEST_BYTES = 16
"""32 hex digits."""


def canonical(value: Any) -> str:
    """``value`` as canonical JSON: sorted keys, no spaces, anything else as its text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def stream_digest(parts: Iterable[bytes]) -> str:
    """The digest of a stream of bytes (a long listing that is no JSON value).

    Args:
        parts: The bytes, in order.

    Returns:
        32 hex digits.
    """
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """What a step's result depends on, and its digest.

    Attributes:
        kind: The step (``stage``, ``validate``, ``train``, ``evaluate``).
        inputs: Input name → a JSON value.
        digest: The digest of ``kind`` and ``inputs`` (:func:`fingerprint`).
    """

    kind: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept with the result (``kind``, ``digest``, ``inputs``)."""
        return {"kind": self.kind, "digest": self.digest, "inputs": dict(self.inputs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Fingerprint | None:
        """A fingerprint kept by :meth:`to_dict`; None for anything else."""
        if not isinstance(data, Mapping) or not isinstance(data.get("digest"), str):
            return None
        inputs = data.get("inputs") if isinstance(data.get("inputs"), Mapping) else {}
        return cls(str(data.get("kind") or ""), dict(inputs), data["digest"])

    def same_as(self, other: Fingerprint | None) -> bool:
        """Whether ``other`` is the fingerprint of the same work."""
        return other is not None and other.kind == self.kind and other.digest == self.digest

    def changed(self, other: Fingerprint | None) -> list[str]:
        """The inputs whose values differ from ``other``'s, in this fingerprint's order.

        An input only one of them has counts as changed.
        """
        if other is None:
            return list(self.inputs)
        names = list(self.inputs) + [k for k in other.inputs if k not in self.inputs]
        return [
            k
            for k in names
            if canonical(self.inputs.get(k, None)) != canonical(other.inputs.get(k, None))
            or (k in self.inputs) != (k in other.inputs)
        ]


def fingerprint(kind: str, inputs: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of a step's inputs.

    Args:
        kind: The step.
        inputs: Everything its result depends on, as JSON values (ids, versions, configs).

    Returns:
        The fingerprint (inputs copied through JSON, so what is kept is what was hashed).
    """
    text = canonical({"kind": kind, "inputs": inputs})
    digest = hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).hexdigest()
    return Fingerprint(kind, json.loads(canonical(inputs)), digest)


def code_identity(project_dir: Path | None = None) -> str:
    """The code's identity for fingerprints: the package's, not the whole checkout's.

    In a git checkout, the tree of ``plugins/`` at ``HEAD`` (a commit of docs or tests
    leaves it as it was), and a digest of the uncommitted changes under it, tracked or
    new, if any: two different sets of edits are two codes. Outside a checkout (an
    image), :func:`trainyard.registry.code_version` (the package version; the image tag
    is an input of its own).

    Args:
        project_dir: The checkout (default: the configured project dir).

    Returns:
        ``plugins@<tree sha>``, ``plugins@<tree sha>+<digest12>`` or ``trainyard <version>``.
    """
    from trainyard.settings import get_settings

    return _code_identity(str(project_dir or get_settings().project_dir))


def _git(cwd: str, *args: str) -> bytes | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.lru_cache(maxsize=4)
def _code_identity(cwd: str) -> str:
    tree = _git(cwd, "rev-parse", "HEAD:plugins")
    if not tree:
        from trainyard.registry import code_version

        return code_version(Path(cwd))
    diff = _git(cwd, "diff", "HEAD", "--no-ext-diff", "--binary", "--", "plugins") or b""
    new = _git(cwd, "ls-files", "--others", "--exclude-standard", "-z", "--", "plugins") or b""
    names = sorted(n for n in new.decode("utf-8", "surrogateescape").split("\0") if n)
    if not diff and not names:
        return f"plugins@{tree.decode().strip()}"
    parts = [diff]
    for name in names:
        try:
            parts += [name.encode("utf-8", "surrogateescape"), (Path(cwd) / name).read_bytes()]
        except OSError:
            continue
    return f"plugins@{tree.decode().strip()}+{stream_digest(parts)[:12]}"


def contract_digest(contract: Any) -> str:
    """A digest of a parsed contract's terms (not of where its file is).

    A contract edited without a new ``version`` is still another contract.
    """
    import dataclasses

    terms = {k: v for k, v in dataclasses.asdict(contract).items() if k != "path"}
    return fingerprint("contract", terms).digest


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` found (``tensorflow``), else None."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def listed(names: Iterable[str], limit: int = 3) -> str:
    """``a, b and c`` (more than ``limit``: the first ones and ``N more``)."""
    items = list(names)
    if len(items) > limit:
        items = [*items[:limit], f"{len(items) - limit} more"]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
