"""Accelerator utilisation (MLPerf Storage / DLIO method) of our input pipeline.

An emulated accelerator spends 0.098 s per batch of 64 images (a ResNet-50 training step)
while our tf.data reader delivers ImageNet-sized JPEGs (~110 KB, generated here) from
staged tar shards, decode and resize to 224x224 included. The compute is emulated as DLIO
does, in the consumer: ``time.sleep`` in the main thread (it holds neither the GIL nor a
core, and no tf.data thread), after taking each batch. AU = emulated compute time / wall
time; MLPerf Storage's pass mark is 0.90.

The images go through the standard ImageNet ResNet-50 *training* preprocessing (TF
official models, the MLPerf reference): a random crop window (area 8-100 %, aspect ratio
3/4-4/3, ``sample_distorted_bounding_box``) of which only the window is decoded
(``decode_and_crop_jpeg``, at a DCT scale where the window is >= 2x the target), resized
to 224x224 and randomly flipped. Decoding just the crop window is what real trainers do,
so it is a legitimate part of "decode and resize". (Evaluation pipelines resize the whole
image, deterministically.)

The host is shared, so wall time is noisy: the run is split into ``--trials`` trials of
``--steps`` steps on one pipeline and the median trial AU is the ratio (each trial's AU
is printed). ``cpu_ms_per_image`` (process CPU time / images) and the cores it takes to
feed 653 images/s are load-independent figures of the pipeline's cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import numpy as np  # noqa: E402

from tests.support.trainer import DIGITS_CONTRACT, make_files_snapshot  # noqa: E402
from trainyard.contracts import parse_contract  # noqa: E402

STEP_S = 0.098
BATCH = 64


def imagenet_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Smooth noise at 375x500 (ImageNet's median size): JPEG of ~110 KB at quality 75."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (n, 94, 125, 3), dtype=np.uint8)
    images = base.repeat(4, axis=1).repeat(4, axis=2)[:, :375, :500]
    noise = rng.integers(0, 48, images.shape[1:], dtype=np.uint8)
    return images + noise, rng.integers(0, 1000, n).astype(np.int64)


def contract(folder: Path):  # type: ignore[no-untyped-def]
    text = DIGITS_CONTRACT.read_text()
    swaps = [
        ("dataset: digits", "dataset: imagenet"),
        ("height: 8", "height: 224"),
        ("width: 8", "width: 224"),
        ("channels: 1", "channels: 3"),
        ("extension: png", "extension: jpg"),
        ("allowed_values: [8]", "min: 1"),
        ("max: 65536", "max: 10000000"),
        ("allowed_values: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]", "min: 0"),
        ("    all_values_present: true\n", ""),
        ("num_classes: 10", "num_classes: 1000"),
    ]
    for a, b in swaps:
        text = text.replace(a, b)
    path = folder / "imagenet.yaml"
    path.write_text(text)
    return parse_contract(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--images", type=int, default=1024, help="distinct images staged (then repeated)"
    )
    p.add_argument("--steps", type=int, default=50, help="steps per trial")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="512 images, 3 trials of 40 steps")
    a = p.parse_args()
    if a.quick:
        a.images, a.steps, a.trials = 512, 40, 3
    from trainyard.training.worker.input import SnapshotInput

    with tempfile.TemporaryDirectory() as tmp:
        images, labels = imagenet_like(a.images)
        snap = make_files_snapshot(
            Path(tmp) / "snap", images=images, labels=labels, shards=8, ext="jpg"
        )
        sizes = [f.stat().st_size for f in snap.glob("shard-*.tar")]
        mean_kb = sum(sizes) / a.images / 1024
        inp = SnapshotInput(snap, contract(Path(tmp)), "all", resize=True)
        it = iter(inp.dataset(BATCH, shuffle=True, repeat=True, augment=True))
        next(it)  # pipeline start-up is not part of a step (MLPerf excludes the first batch too)
        aus, cpu, walls = [], 0.0, 0.0
        for _ in range(a.trials):
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(a.steps):
                x, _y = next(it)
                assert x["image"].shape == (BATCH, 224, 224, 3)
                time.sleep(STEP_S)  # the emulated accelerator computes
            wall = time.perf_counter() - t0
            cpu += time.process_time() - c0
            walls += wall
            aus.append(a.steps * STEP_S / wall)
    au = statistics.median(aus)
    n = a.trials * a.steps * BATCH
    cpu_ms = cpu / n * 1000
    need = BATCH / STEP_S
    print(
        f"images={a.images} mean_jpeg_kb={mean_kb:.0f} trials={a.trials}x{a.steps} steps "
        f"AU per trial: {' '.join(f'{x:.3f}' for x in aus)}"
    )
    print(
        f"BENCH accelerator_utilisation ratio={au:.3f} images_per_s={n / walls:.0f} "
        f"needed_images_per_s={need:.0f} cpu_ms_per_image={cpu_ms:.2f} "
        f"cores_to_feed={cpu_ms * need / 1000:.2f}"
    )


if __name__ == "__main__":
    main()
