"""The stream scorer's C module, built with ASan and UBSan, fuzzed against the Python paths.

A seeded, bounded run. Random batches of records (hostile values: bools, huge and
non-integral numbers, NaN, nested values, wrong types, missing and unknown fields, nulls,
dict subclasses, non-dicts) are checked by ``check_parsed`` on two contracts and must get
``check``'s reasons and ``columns``' inputs exactly; random score batches (hostile keys,
every float, classes of every size) must pack to the Python path's bytes, and mangled
score arrays must be refused with ValueError; random XREADGROUP replies, cut and
mangled, must read as hiredis and the Python path read them, or ask for more bytes
exactly when hiredis does, or be left to them. The sanitizers abort the process on any
out-of-bounds access, use after free or undefined behaviour.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sanitizer import ROOT, run_sanitized, sanitized_build

SOURCE = ROOT / "plugins" / "trainyard" / "streaming" / "_hotpath.c"

FUZZ = r"""
import importlib.machinery, importlib.util, random, sys, time
from pathlib import Path
import hiredis, numpy as np, orjson

name = "trainyard.streaming._hotpath"
spec = importlib.util.spec_from_file_location(
    name, sys.argv[1], loader=importlib.machinery.ExtensionFileLoader(name, sys.argv[1])
)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules[name] = module
from trainyard.contracts import parse_contract_text
from trainyard.streaming import engines, records
assert records._hotpath is module and engines._hotpath is module, "not the sanitized build"

rng = random.Random(int(sys.argv[2]))
budget = float(sys.argv[3])
root = Path(sys.argv[4])
from tests.support.streams import LOOSE_CONTRACT as loose
path = root / "data_contracts" / "transactions.yaml"
checkers = [
    (records.RecordChecker(parse_contract_text(path.read_text(), path)),
     {"txn_id": "t-1", "amount": 12.5, "hour": 3, "customer_age": 40}),
    (records.RecordChecker(parse_contract_text(loose, Path("loose.yaml"))),
     {"id": "t-1", "x": 0.5, "n": 1, "flag": True}),
]
assert all(c._hot is not None for c, _ in checkers)


class Sub(dict):
    pass


def value():
    return rng.choice([
        None, True, False, 0, 1, -1, 3, 3.0, -0.0, 0.5, 23, 24, 1e39, -1e39, 5e-324,
        float("inf"), float("nan"), 2**31, -(2**31) - 1, 2**53 + 1, 2**63, -(2**63), 10**30,
        "", "x", "t-1", "t 1", "fuel", "toys", "ünï", "a" * 70, [1], {"a": 1}, b"b",
        rng.uniform(-200, 200), rng.randrange(-5, 30),
    ])


def batch(good):
    out = []
    for _ in range(rng.randrange(0, 300)):
        kind = rng.random()
        if kind < 0.02:
            out.append(rng.choice([None, 7, "s", [good], Sub(good)]))
            continue
        r = dict(good)
        for _ in range(rng.randrange(0, 4)):
            k = rng.choice([*good, "merchant_category", "is_fraud", "w", "y", "zz"])
            if rng.random() < 0.15:
                r.pop(k, None)
            else:
                r[k] = value()
        out.append(r)
    return out


def key():
    size = rng.randrange(8) if rng.random() < 0.97 else rng.randrange(700, 3000)
    chars = (rng.choice([rng.randrange(0x20), rng.randrange(0x20, 0x110000)])
             for _ in range(size))
    return "".join(chr(c) for c in chars if not 0xD800 <= c < 0xE000)


def mangle(b):
    b = bytearray(b)
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(b) + 1)
        op = rng.randrange(4)
        if op == 0 and b:
            del b[min(i, len(b) - 1)]
        elif op == 1:
            b[i:i] = rng.choice([b",", b"[", b"]", b"", b"1"])
        elif op == 2:
            b = b[:i]
        elif b:
            b[min(i, len(b) - 1)] = ord(",")
    return bytes(b)


def resp_reply(x):
    if x is None:
        return b"*-1\r\n"
    if isinstance(x, list):
        return b"*%d\r\n" % len(x) + b"".join(map(resp_reply, x))
    return b"$%d\r\n%b\r\n" % (len(x), x)


def mangle_resp(b):
    b = bytearray(b)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(b) + 1)
        if rng.random() < 0.5 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        else:
            b[i:i] = rng.choice([b"\r", b"\n", b"$", b"*", b"9", b"-1", b"\x00", b"0" * 17])
    return bytes(b)


deadline = time.monotonic() + budget
checked = packed = refused = entries = 0
while time.monotonic() < deadline:
    checker, good = rng.choice(checkers)
    recs = batch(good)
    reasons, inputs = checker.check_parsed(recs)
    assert reasons == [checker.check(r) for r in recs] == checker.check_batch(recs)
    want = checker.columns([r for r, why in zip(recs, reasons) if why is None])
    assert list(inputs) == list(want)
    for n, col in want.items():
        assert inputs[n].tobytes() == col.tobytes(), n
    checked += len(recs)

    n = rng.randrange(0, 200)
    keys = [key() for _ in range(n)]
    sources = [f"{rng.randrange(1 << 45)}-{i}" for i in range(n)]
    scores = [rng.choice([rng.random(), float("nan"), 3.7e-44, -0.0, 1e300]) for _ in range(n)]
    classes = [rng.choice([None, 0, 1, 2**62, -(2**63)]) for _ in range(n)]
    version = rng.randrange(1 << 40)
    text = orjson.dumps(scores)
    got = module.scores_resp(keys, sources, text, classes, version)
    outs = engines.encode_scores(keys, sources, scores, classes, version)
    assert got == engines._pack_outputs(outs)
    packed += n
    bad = mangle(text)
    try:
        module.scores_resp(keys, sources, bad, classes, version)
    except ValueError:
        refused += 1

    raw = [[b"%d-%d" % (rng.randrange(1 << 40), i), [b"value", orjson.dumps(good)]]
           for i in range(rng.randrange(50))]
    if raw and rng.random() < 0.3:
        raw[rng.randrange(len(raw))] = rng.choice([
            [b"1-0", [b"key", b"k", b"value", b"v"]], [b"1-0", None], [b"1-0"], b"x",
            [b"1-0", [b"value"]], [b"1-0", [b"valu", b"v"]], [b"1-\xff", [b"value", b"v"]],
        ])
    data = resp_reply(rng.choice([[[b"in", raw]], None, [[b"in", raw], [b"in2", raw]]]))
    if rng.random() < 0.5:
        data = mangle_resp(data) if rng.random() < 0.5 else data[: rng.randrange(len(data) + 1)]
    got = module.stream_reply(data, engines.Message)
    reader = hiredis.Reader()
    reader.feed(data)
    try:
        parsed = reader.gets()
    except hiredis.ProtocolError:
        parsed = "refused"
    if got is None:
        assert parsed is False, data
    elif got is not False:
        messages, end = got
        reader = hiredis.Reader()
        reader.feed(data[:end])
        parsed = reader.gets()
        read = [] if parsed is None else parsed[0][1]
        want = [engines.Message(e.decode(), f[1]) for e, f in read]
        assert messages == want and reader.gets() is False, data
    entries += len(raw)
print(f"FUZZ checked={checked} packed={packed} refused={refused} entries={entries}")
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_c_hotpath_under_sanitizers_agrees_with_python(seed: int, tmp_path: Path) -> None:
    module = sanitized_build(SOURCE, tmp_path)
    out = run_sanitized(FUZZ, str(module), str(seed), "10", str(ROOT))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("FUZZ"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    assert int(fields["checked"]) > 20000 and int(fields["packed"]) > 5000, line
    assert int(fields["refused"]) > 10 and int(fields["entries"]) > 2000, line
