"""The C request parser and response printer, built with ASan and UBSan, fuzzed.

A seeded, bounded run: valid float32 bodies in several row shapes with every number
spelling JSON allows (signs, zeros, fractions, exponents, long mantissas and exponents,
values at and beyond float32's range), then the same bodies mutated (bytes flipped,
inserted, deleted, truncated, brackets and commas moved). For each, what ``_decode``
accepts must be bit-identical to ``json.loads`` then float32, and whatever the JSON path
refuses it must leave to it (return None). Then random float32 bit patterns in random
shapes are printed by ``float32_json`` and compared with TF Serving's text of each value
(``schema.tf_float_text``). The sanitizers abort the process on any
out-of-bounds access, use after free or undefined behaviour.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sanitizer import run_sanitized, sanitized_build

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "plugins" / "trainyard" / "serving" / "_decode.c"

FUZZ = r"""
import importlib.machinery, importlib.util, json, random, sys, time
import numpy as np

spec = importlib.util.spec_from_file_location(
    "trainyard.serving._decode",
    sys.argv[1],
    loader=importlib.machinery.ExtensionFileLoader("trainyard.serving._decode", sys.argv[1]),
)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["trainyard.serving._decode"] = module
import trainyard.serving
trainyard.serving._decode = module
from trainyard.serving import schema
assert schema._decode is module, "the sanitized build is not the one in use"

rng = random.Random(int(sys.argv[2]))
budget = float(sys.argv[3])


def number():
    kind = rng.randrange(10)
    sign = "-" if rng.random() < 0.3 else ""
    if kind == 0:
        return sign + "0"
    if kind == 1:
        return sign + str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 2:
        return f"{sign}{rng.randrange(1000)}.{rng.randrange(10 ** rng.randrange(1, 30))}"
    if kind == 3:
        return f"{sign}{rng.randrange(1, 10)}e{rng.choice(['', '+', '-'])}{rng.randrange(60)}"
    if kind == 4:
        return repr(float(np.float32(rng.uniform(-1, 1) * 10.0 ** rng.randrange(-45, 39))))
    if kind == 5:  # float32 rounding boundaries
        f = np.float32(rng.uniform(-1e6, 1e6))
        up = np.nextafter(f, np.float32(np.inf))
        return repr((float(f) + float(up)) / 2)
    if kind == 6:
        return sign + "1" + "0" * rng.randrange(20, 400) + "e-" + str(rng.randrange(1, 2000000))
    if kind == 7:
        return sign + "0." + "0" * rng.randrange(1, 60) + str(rng.randrange(1, 10 ** 12))
    if kind == 8:
        return sign + rng.choice(["3.4028235e38", "3.4028236e38", "1e39", "1.4e-45", "7e-46"])
    return f"{sign}{rng.randrange(10)}.{rng.randrange(10)}E{rng.randrange(-9, 9)}"


def body(shape):
    def nest(dims):
        if not dims:
            return number()
        sep = rng.choice([",", ", ", " ,", ",\n"])
        return "[" + sep.join(nest(dims[1:]) for _ in range(dims[0])) + "]"

    rows = rng.randrange(1, 6)
    key = rng.choice(['"instances"', '"inputs"', '"inputs": {"x"'])
    close = "}}" if key.endswith('"x"') else "}"
    return f'{{{key}: {nest((rows, *shape))}{close}'.encode(), shape


def mutate(b):
    b = bytearray(b)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] = rng.randrange(256)
        elif op == 1:
            junk = [b"[", b"]", b",", b"-", b".", b"e", b"0", b" ", b"\x00", b"9" * 40]
            b[i:i] = rng.choice(junk)
        elif op == 2 and b:
            del b[i]
        elif op == 3:
            b = b[: rng.randrange(len(b) + 1)]
        elif op == 4:
            b[i:i] = b[rng.randrange(len(b) + 1):][:8]
        else:
            b = b.replace(b",", b"", 1)
    return bytes(b)


def json_path(raw, shape):
    try:
        doc = json.loads(raw)
        value = doc.get("instances", doc.get("inputs"))
        if isinstance(value, dict):
            value = value["x"]
        arr = np.asarray(value, dtype=np.float64)
        if arr.shape[1:] != shape or arr.dtype.kind != "f" or not arr.size:
            return None
        with np.errstate(over="ignore"):
            out = arr.astype(np.float32)
        return out if np.isfinite(out).all() else None
    except Exception:
        return None


shapes = [(1,), (3,), (2, 2), (4, 1), (2, 3, 1)]
deadline = time.monotonic() + budget
cases = accepted = 0
while time.monotonic() < deadline:
    raw, shape = body(rng.choice(shapes))
    for candidate in (raw, mutate(raw)):
        cases += 1
        start, end = candidate.find(b"["), candidate.rfind(b"]")
        if start < 0 or end < start:
            continue
        module.float32_rows(candidate, start, end + 1, shape)  # any region: must not crash
        got = schema._fast_decode(candidate, {"x": ("float32", (None, *shape))})
        want = json_path(candidate, shape)
        if got is None:
            continue
        fast = got[0]["x"]
        assert want is not None, f"fast path accepted what JSON refuses: {candidate[:200]!r}"
        accepted += 1
        assert fast.tobytes() == want.tobytes(), f"C and JSON differ on {candidate[:200]!r}"
# the response printer: random float32 bit patterns in random shapes (empty ones too),
# printed in C, must be TF Serving's text of each value, bracketed as the shape says
printed = 0
for _ in range(300):
    shape = tuple(rng.randrange(0, 5) for _ in range(rng.randrange(1, 4)))
    bits = np.array([rng.getrandbits(32) for _ in range(int(np.prod(shape)))], np.uint32)
    values = bits.view(np.float32).reshape(shape)
    text = module.float32_json(values, shape)
    if values.size:
        tokens = [schema.tf_float_text(float(v), True) for v in values.reshape(-1)]
        assert text == schema._nested(tokens, shape), (values, text)
    else:
        assert text is None, text
    printed += values.size
print(f"FUZZ cases={cases} accepted={accepted} printed={printed}")
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_c_parser_under_sanitizers_agrees_with_json(seed: int, tmp_path: Path) -> None:
    module = sanitized_build(SOURCE, tmp_path)
    out = run_sanitized(FUZZ, str(module), str(seed), "12")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("FUZZ"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    assert int(fields["cases"]) > 2000 and int(fields["accepted"]) > 500, line
