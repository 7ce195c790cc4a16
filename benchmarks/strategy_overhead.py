"""Samples/s of one MultiWorkerMirroredStrategy worker vs plain ``fit`` of the same model.

Same model (``small_cnn`` from the registry), same in-memory digits data fed the same way
(``DatasetCreator``), same global batch and ``steps_per_execution``, both warmed up
(tracing, collective group set-up) before anything is timed. Plain ``fit`` and the
one-worker MWMS ``fit`` live in the same process and are timed in paired rounds (the order
alternates round by round), so both see the same (shared, noisy) host; each round gives
one MWMS ÷ plain ratio and the ratio reported is the median over rounds. Rounds are short
(one pass each) and many: a neighbour taking a core halves either side's rate, and short
paired rounds mostly see the same load on both sides. Process CPU time
per sample of each side is reported too: a load-independent view of the overhead. Two
MWMS workers on this host (two processes sharing the same cores) are reported beside it:
their global samples/s (median epoch, slowest worker) ÷ plain's median.
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

    from tests.support.trainer import digits_arrays
    from trainyard.training.worker.architectures import ModelSpec, build_model

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
    steps = len(x) // batch  # one pass per timed fit (~0.5-1 s): many short paired rounds
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up: tracing, collectives

    def epoch() -> tuple[float, float]:
        """(samples/s, CPU ms per 1000 samples) of one timed ``fit``."""
        c0, t0 = time.process_time(), time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return steps * batch / wall, cpu / (steps * batch) * 1e6

    return epoch


def child(mode: str, epochs: int, batch: int, spe: int) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]
    import tensorflow as tf

    from trainyard.training.worker.main import communication_options

    mwms = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options())
    mwms_epoch = _setup(batch, spe, mwms)
    if mode == "pair":
        plain_epoch = _setup(batch, spe, tf.distribute.get_strategy())
        rates: dict[str, list[float]] = {"plain": [], "mwms": [], "plain_cpu": [], "mwms_cpu": []}
        for i in range(epochs):
            sides = [("plain", plain_epoch), ("mwms", mwms_epoch)]
            for name, fn in sides if i % 2 == 0 else sides[::-1]:
                rate, cpu = fn()
                rates[name].append(rate)
                rates[f"{name}_cpu"].append(cpu)
        print("RATES " + json.dumps(rates), flush=True)
    else:
        print("RATES " + json.dumps({"mwms": [mwms_epoch()[0] for _ in range(epochs)]}), flush=True)


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
    p.add_argument("--epochs", type=int, default=24, help="timed rounds per configuration")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--spe", type=int, default=8, help="steps_per_execution")
    p.add_argument("--quick", action="store_true", help="12 timed rounds")
    a = p.parse_args()
    if a.quick:
        a.epochs = 12
    if a.child:
        child(a.child, a.epochs, a.batch, a.spe)
        return
    (pair,) = run("pair", 1, a)
    two = [
        min(r) for r in zip(*(w["mwms"] for w in run("mwms", 2, a)), strict=True)
    ]  # slowest sets the pace
    med = statistics.median
    ratios = [m / p for m, p in zip(pair["mwms"], pair["plain"], strict=True)]
    plain, one = med(pair["plain"]), med(pair["mwms"])
    print(
        f"samples/s medians: plain={plain:.0f} mwms1={one:.0f} mwms2_global={med(two):.0f} "
        f"(batch={a.batch} spe={a.spe}); per-round mwms1/plain: "
        f"{' '.join(f'{r:.3f}' for r in ratios)}; CPU ms/1000 samples: "
        f"plain={med(pair['plain_cpu']):.0f} mwms1={med(pair['mwms_cpu']):.0f}"
    )
    print(
        f"BENCH strategy_overhead ratio={med(ratios):.3f} ours={one:.0f} baseline={plain:.0f} "
        f"cpu_ratio={med(pair['plain_cpu']) / med(pair['mwms_cpu']):.3f} "
        f"two_workers={med(two) / plain:.3f}"
    )


if __name__ == "__main__":
    main()
