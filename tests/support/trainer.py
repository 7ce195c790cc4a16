"""Small real snapshots (tar + Parquet, same layout as staging writes) for trainer tests."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CONTRACT = ROOT / "data_contracts" / "digits.yaml"

TABLE_CONTRACT = """\
dataset: blobs
version: 1.0.0
owner: ml@example.com
source: {format: parquet}
columns:
  - {name: id, type: string}
  - {name: x1, type: float64}
  - {name: x2, type: float64}
  - {name: x3, type: float64}
  - {name: label, type: int64}
roles:
  key: id
  label: label
  features: [x1, x2, x3]
  num_classes: 3
split:
  holdout_fraction: 0.2
  by: id
"""


def _manifest(snap: Path, kind: str, shards: list[tuple[str, str]]) -> None:
    """A real, complete manifest (the staging format), with real BLAKE3 shard hashes."""
    from trainyard import volumes
    from trainyard.fsutil import atomic_write_json

    infos = [
        volumes.ShardInfo(
            path=p,
            bytes=(snap / p).stat().st_size,
            rows=0,
            hash=volumes.hash_file(snap / p),
            role=role,
        )
        for p, role in shards
    ]
    manifest = volumes.Manifest(
        # content-addressed, as staging does: readers check the id against the shards
        snapshot_id=volumes.compute_snapshot_id(kind, "1", infos),
        dataset="fixture",
        kind=kind,  # type: ignore[arg-type]
        shards=infos,
        hash_algo="blake3",
        schema=[],
        contract_version="1",
        source={"url": "fixture"},
        interval=None,
        created_at="2026-11-01T00:00:00+00:00",
        rows=0,
        bytes=sum(i.bytes for i in infos),
    )
    atomic_write_json(snap / "manifest.json", manifest.to_dict())


def digits_arrays(n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.round(d.images * 255 / 16).astype(np.uint8)
    labels = d.target.astype(np.int64)
    if n is not None:
        reps = -(-n // len(labels))
        images, labels = np.tile(images, (reps, 1, 1))[:n], np.tile(labels, reps)[:n]
    return images, labels


def make_files_snapshot(
    snap: Path,
    n: int | None = 600,
    shards: int = 3,
    ext: str = "png",
    images: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> Path:
    """A files snapshot of sklearn digits: shard-*.tar (<key>.png + <key>.cls) + index.parquet."""
    if images is None or labels is None:
        images, labels = digits_arrays(n)
    snap.mkdir(parents=True)
    rows: dict[str, list] = {
        "key": [],
        "label": [],
        "shard": [],
        "bytes": [],
        "width": [],
        "height": [],
    }
    per = -(-len(labels) // shards)
    names = []
    for s in range(shards):
        name = f"shard-{s:05d}.tar"
        names.append((name, "data"))
        with tarfile.open(snap / name, "w") as tar:
            for i in range(s * per, min((s + 1) * per, len(labels))):
                key = f"{labels[i]}/img_{i:06d}"
                buf = io.BytesIO()
                Image.fromarray(images[i]).save(buf, format="PNG" if ext == "png" else "JPEG")
                data = buf.getvalue()
                for member, payload in (
                    (f"{key}.{ext}", data),
                    (f"{key}.cls", str(labels[i]).encode()),
                ):
                    info = tarfile.TarInfo(member)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                h, w = images[i].shape[:2]
                for col, v in zip(rows, (key, int(labels[i]), name, len(data), w, h), strict=True):
                    rows[col].append(v)
    pq.write_table(pa.table(rows), snap / "index.parquet")
    _manifest(snap, "files", [*names, ("index.parquet", "index")])
    return snap


def blobs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    centers = np.array([[0, 0, 0], [4, 4, 0], [0, 4, 4]], dtype=np.float64) * 10 + 100
    x = centers[label] + rng.normal(0, 5, (n, 3))
    return {
        "id": np.array([f"r{i:07d}" for i in range(n)]),
        "x1": x[:, 0],
        "x2": x[:, 1],
        "x3": x[:, 2],
        "label": label,
    }


def make_table_snapshot(snap: Path, n: int = 900, parts: int = 3) -> Path:
    """A table snapshot: part-*.parquet of 3 separable Gaussian blobs."""
    cols = blobs(n)
    snap.mkdir(parents=True)
    per = -(-n // parts)
    names = []
    for p in range(parts):
        name = f"part-{p:05d}.parquet"
        pq.write_table(
            pa.table({k: v[p * per : (p + 1) * per] for k, v in cols.items()}), snap / name
        )
        names.append((name, "data"))
    _manifest(snap, "table", names)
    return snap


def write_table_contract(folder: Path) -> Path:
    path = folder / "blobs.yaml"
    path.write_text(TABLE_CONTRACT)
    return path


def publish_fixture(made: Path, volume_root: Path, dataset: str) -> str:
    """Move a fixture snapshot to ``<volume_root>/<dataset>/snapshots/<its id>``; its id.

    Snapshot ids are content-addressed: readers check the folder name against the manifest.
    """
    import json
    import shutil

    snapshot_id = json.loads((made / "manifest.json").read_text())["snapshot_id"]
    folder = volume_root / dataset / "snapshots"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.move(made, folder / snapshot_id)
    return str(snapshot_id)
