"""Samples/s of one MultiWorkerMirroredStrategy worker vs plain ``fit`` of the same model.

Same model (``small_cnn`` from the registry), same in-memory digits data, same global
batch and ``steps_per_execution``. Plain ``fit`` and the one-worker MWMS ``fit`` live in
the same process and alternate epoch by epoch, so both see the same (shared, noisy) host;
each figure is the best epoch. Two MWMS workers on this host (two processes sharing the
same cores) are reported beside it: their global samples/s ÷ plain.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup(batch: int, spe: int, strategy):  # type: ignore[no-untyped-def]
    import tensorflow as tf
    import tf_keras as keras
    from trainer_fixtures import digits_arrays

    from trainyard.trainer.models import ModelSpec, build_model

    images, labels = digits_arrays(16_384)
    x = images[..., None].astype("float32") / 255.0

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(({"image": x}, labels))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()
        return ds.batch(ctx.get_per_replica_batch_size(batch), drop_remainder=True).prefetch(2)

    with strategy.scope():
        model = build_model("small_cnn", ModelSpec({"image": ("float32", (None, 8, 8, 1))}, 10))
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=spe,
        )
    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    steps = len(x) // batch
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up: tracing, collectives

    def epoch() -> float:
        t0 = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        return steps * batch / (time.perf_counter() - t0)

    return epoch


def child(mode: str, epochs: int, batch: int, spe: int) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "tests")]
    import tensorflow as tf

    from trainyard.trainer.worker import communication_options

    mwms = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options())
    mwms_epoch = _setup(batch, spe, mwms)
    if mode == "pair":
        plain_epoch = _setup(batch, spe, tf.distribute.get_strategy())
        rates: dict[str, list[float]] = {"plain": [], "mwms": []}
        for _ in range(epochs):
            rates["plain"].append(plain_epoch())
            rates["mwms"].append(mwms_epoch())
        print("RATES " + json.dumps(rates), flush=True)
    else:
        print("RATES " + json.dumps({"mwms": [mwms_epoch() for _ in range(epochs)]}), flush=True)


def ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out


def run(mode: str, workers: int, args: argparse.Namespace) -> list[dict[str, list[float]]]:
    addrs = [f"127.0.0.1:{p}" for p in ports(workers)]
    procs = []
    for i in range(workers):
        tf_config = {"cluster": {"worker": addrs}, "task": {"type": "worker", "index": i}}
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_USE_LEGACY_KERAS="1",
            TF_CONFIG=json.dumps(tf_config),
        )
        cmd = [sys.executable, __file__, "--child", mode, "--epochs", str(args.epochs),
               "--batch", str(args.batch), "--spe", str(args.spe)]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        )
    outs = [p.communicate(timeout=900)[0] for p in procs]
    rates = [json.loads(ln[6:]) for o in outs for ln in o.splitlines() if ln.startswith("RATES ")]
    if len(rates) != workers:
        raise SystemExit(f"{mode} x{workers} failed: {outs}")
    return rates


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", default=None)
    p.add_argument("--epochs", type=int, default=8, help="measured epochs per configuration")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--spe", type=int, default=8, help="steps_per_execution")
    p.add_argument("--quick", action="store_true", help="4 measured epochs")
    a = p.parse_args()
    if a.quick:
        a.epochs = 4
    if a.child:
        child(a.child, a.epochs, a.batch, a.spe)
        return
    (pair,) = run("pair", 1, a)
    two = [
        min(r) for r in zip(*(w["mwms"] for w in run("mwms", 2, a)), strict=True)
    ]  # slowest sets the pace
    plain, one = max(pair["plain"]), max(pair["mwms"])
    print(
        f"best epoch samples/s: plain={plain:.0f} mwms1={one:.0f} mwms2_global={max(two):.0f}; "
        f"medians: plain={statistics.median(pair['plain']):.0f} "
        f"mwms1={statistics.median(pair['mwms']):.0f} "
        f"(batch={a.batch} spe={a.spe})"
    )
    print(f"BENCH strategy_overhead ratio={one / plain:.3f} two_workers={max(two) / plain:.3f}")


if __name__ == "__main__":
    main()
