"""Bundled generators that write a raw source when it is missing (the demo's data lake).

Selected by ``pipeline.source.bootstrap``. Each writes into a private sibling path and
renames it into place, so a half-written source is never staged.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from trainyard.errors import StagingError
from trainyard.fsutil import fsync_dir

# exactly the contract's allowed_values (data_contracts/transactions.yaml)
MERCHANT_CATEGORIES = (
    "grocery",
    "fuel",
    "travel",
    "dining",
    "electronics",
    "fashion",
    "health",
    "online",
)
_RISKY = {"travel": 0.8, "electronics": 1.0, "online": 1.4}


def _private_sibling(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.parent / f".{dest.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"


def _publish(tmp: Path, dest: Path) -> None:
    try:
        os.rename(tmp, dest)
    except OSError:
        if dest.exists():  # another run bootstrapped it first: same content, keep theirs
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
            return
        raise
    fsync_dir(dest.parent)


def sklearn_digits(dest: Path) -> Path:
    """Write scikit-learn's 1797 8x8 digits as PNG files in class folders.

    Layout: ``<dest>/<digit>/img_<i:04d>.png``, grey-scale (mode ``L``), pixel =
    ``round(v * 255 / 16)``.

    Args:
        dest: The folder to create.

    Returns:
        ``dest``.
    """
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    tmp = _private_sibling(dest)
    try:
        for d in range(10):
            (tmp / str(d)).mkdir(parents=True)
        pixels = np.rint(digits.images * 255.0 / 16.0).clip(0, 255).astype(np.uint8)
        for i, (img, target) in enumerate(zip(pixels, digits.target, strict=True)):
            Image.fromarray(img, mode="L").save(tmp / str(int(target)) / f"img_{i:04d}.png")
        _publish(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def synthetic_transactions(dest: Path, ds: str, rows: int = 2000) -> Path:
    """Write one day of a fraud-like transactions table as CSV, deterministic per day.

    Columns: ``txn_id`` (``{ds}-{i:06d}``), ``amount`` (float > 0), ``hour`` (0..23),
    ``merchant_category`` (one of 8), ``customer_age`` (18..90), ``is_fraud`` (0/1, about
    10%, more likely for large amounts, at night, for customers under 25 and in risky
    categories).

    Args:
        dest: A ``.csv`` file path, or a folder (then ``<dest>/transactions.csv``).
        ds: The day (``YYYY-MM-DD``); seeds the generator, so each day differs slightly.
        rows: About how many rows (varies by a few percent per day).

    Returns:
        The CSV file written.

    Raises:
        StagingError: If ``ds`` is not a date.
    """
    try:
        day = dt.date.fromisoformat(ds[:10])
    except (TypeError, ValueError) as e:
        raise StagingError(f"synthetic_transactions: {ds!r} is not a YYYY-MM-DD date") from e
    path = dest if dest.suffix == ".csv" else dest / "transactions.csv"
    rng = random.Random(day.toordinal())
    n = rows + rng.randint(-rows // 20, rows // 20)
    lines = ["txn_id,amount,hour,merchant_category,customer_age,is_fraud"]
    for i in range(n):
        hour = rng.choices(range(24), weights=[1 if h < 6 else 3 for h in range(24)])[0]
        category = rng.choice(MERCHANT_CATEGORIES)
        amount = round(rng.lognormvariate(3.6, 1.0) + 0.5, 2)
        age = rng.randint(18, 90)
        # What the model sees (amount, hour, age) decides most of it: ranked by these
        # three, the true odds give an AUC of about 0.88, above the pipeline's gate (0.75);
        # the category, which the model does not see, adds a little.
        score = (
            -3.95
            + 1.8 * (math.log(amount) - 3.6)
            + 2.5 * (hour < 6)
            + 1.0 * (age < 25)
            + 0.4 * _RISKY.get(category, 0.0)
        )
        p = 1.0 / (1.0 + math.exp(-score))
        fraud = 1 if rng.random() < p else 0
        lines.append(f"{ds[:10]}-{i:06d},{amount:.2f},{hour},{category},{age},{fraud}")
    tmp = _private_sibling(path)
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


BOOTSTRAPS: dict[str, Callable[[Path, str | None], Path]] = {
    "sklearn_digits": lambda dest, ds: sklearn_digits(dest),
    "synthetic_transactions": lambda dest, ds: synthetic_transactions(
        dest, ds or dt.date.today().isoformat()
    ),
}


def run_bootstrap(name: str, dest: Path, ds: str | None) -> Path:
    """Run the named generator into ``dest``.

    Raises:
        StagingError: If no generator has that name.
    """
    try:
        fn = BOOTSTRAPS[name]
    except KeyError as e:
        known = ", ".join(sorted(BOOTSTRAPS))
        raise StagingError(f"unknown bootstrap generator {name!r} (known: {known})") from e
    return fn(dest, ds)
