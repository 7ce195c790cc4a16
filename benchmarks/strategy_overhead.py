"""Samples/s of one MultiWorkerMirroredStrategy worker vs plain ``fit`` of the same model.

Same model (``small_cnn`` from the registry), same in-memory digits data, same batch and
``steps_per_execution``; each configuration runs in its own process(es) so they do not
share a TensorFlow runtime. Two MWMS workers on this host are reported beside (global
samples/s ÷ plain; they share the same cores, so it measures overhead, not speed-up).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, epochs: int, batch: int, spe: int) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "tests")]
    import tensorflow as tf
    import tf_keras as keras
    from trainer_fixtures import digits_arrays

    from trainyard.trainer.models import ModelSpec, build_model

    images, labels = digits_arrays(16_384)
    x = images[..., None].astype("float32") / 255.0
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy()
        if mode == "mwms"
        else tf.distribute.get_strategy()
    )
    workers = json.loads(os.environ.get("TF_CONFIG", '{"cluster": {"worker": [1]}}'))["cluster"][
        "worker"
    ]
    steps = len(x) // batch

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(({"image": x}, labels)).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id
        )
        return (
            ds.repeat()
            .batch(ctx.get_per_replica_batch_size(batch), drop_remainder=True)
            .prefetch(2)
        )

    with strategy.scope():
        model = build_model("small_cnn", ModelSpec({"image": ("float32", (None, 8, 8, 1))}, 10))
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)  # fmt: skip
    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up: tracing, collectives
    t0 = time.perf_counter()
    model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0)
    rate = epochs * steps * batch / (time.perf_counter() - t0)
    print(f"RATE {rate:.1f} workers={len(workers)}", flush=True)


def ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out


def run(mode: str, workers: int, args: argparse.Namespace) -> float:
    addrs = [f"127.0.0.1:{p}" for p in ports(workers)]
    procs = []
    for i in range(workers):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
        if mode == "mwms":
            env["TF_CONFIG"] = json.dumps(
                {"cluster": {"worker": addrs}, "task": {"type": "worker", "index": i}}
            )
        cmd = [sys.executable, __file__, "--child", mode, "--epochs", str(args.epochs),
               "--batch", str(args.batch), "--spe", str(args.spe)]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        )
    outs = [p.communicate(timeout=900)[0] for p in procs]
    rates = [
        float(line.split()[1]) for o in outs for line in o.splitlines() if line.startswith("RATE")
    ]
    if len(rates) != workers:
        raise SystemExit(f"{mode} x{workers} failed: {outs}")
    return min(rates)  # every worker processes the global batch per step; the slowest sets the pace


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--spe", type=int, default=8, help="steps_per_execution")
    p.add_argument("--quick", action="store_true", help="2 epochs")
    a = p.parse_args()
    if a.quick:
        a.epochs = 2
    if a.child:
        child(a.child, a.epochs, a.batch, a.spe)
        return
    plain = run("plain", 1, a)
    one = run("mwms", 1, a)
    two = run("mwms", 2, a)
    print(
        f"plain={plain:.0f} mwms1={one:.0f} mwms2_global={two:.0f} samples/s (batch={a.batch} spe={a.spe})"
    )
    print(f"BENCH strategy_overhead ratio={one / plain:.3f} two_workers={two / plain:.3f}")


if __name__ == "__main__":
    main()
