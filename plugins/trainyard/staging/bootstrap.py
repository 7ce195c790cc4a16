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


def _day(ds: str, generator: str) -> dt.date:
    try:
        return dt.date.fromisoformat(ds[:10])
    except (TypeError, ValueError) as e:
        raise StagingError(f"{generator}: {ds!r} is not a YYYY-MM-DD date") from e


def _write_csv(path: Path, lines: list[str]) -> Path:
    """Publish ``lines`` as ``path`` whole (written to a private sibling, synced, renamed)."""
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
    day = _day(ds, "synthetic_transactions")
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
    return _write_csv(path, lines)


CHURN_EPOCH = dt.date(2026, 11, 1)
"""Day 0 of the churn data's drift (the pipeline's start_date)."""
CHURN_CHANNELS = ("store", "web", "app", "phone")
CHURN_CITIES = 400
_CHURN_CITY_EFFECT = {3: 1.2, 7: 0.9, 12: -1.0, 25: 0.8, 41: -0.7}
_CHURN_REGION = {11: 0.0, 12: 0.2, 21: -0.3, 22: 0.0, 31: 0.6}


def churn_channel_weights(day: dt.date) -> list[float]:
    """The share of each of :data:`CHURN_CHANNELS` on ``day``.

    ``app`` holds 10 % for the first three days of the pipeline (from its start_date), then
    gains 15 points a day (to at most 70 %), taken from the others in proportion: an app
    launch that the channel's drift rules see from the fourth day on.
    """
    app = min(0.10 + 0.15 * max((day - CHURN_EPOCH).days - 2, 0), 0.70)
    rest = 1.0 - app
    return [rest * 0.45, rest * 0.35, app, rest * 0.20]


def synthetic_churn(dest: Path, ds: str, rows: int = 1200) -> Path:
    """Write one day of a customer-churn table as CSV, deterministic per day.

    An ordinary daily export: numbers, string categories and a few percent empty cells.
    Columns: ``customer_id`` (``{ds}-{i:05d}``), ``tenure_months`` (0..72),
    ``monthly_charges`` (about 4 % empty), ``total_spend`` (about 3 % ``null`` or
    ``NA``), ``support_calls`` (0..15), ``plan`` (basic / standard / premium),
    ``contract_type`` (monthly / yearly / two_year, about 5 % ``NA``),
    ``payment_method``, ``channel`` (``app`` gains 15 points a day from the fourth day:
    :func:`churn_channel_weights`), ``city`` (400 cities, Zipf-distributed: a long tail,
    about 3 % empty), ``region_code`` (an integer code), ``churned`` (0/1, about a
    third). Short tenure, high charges, many support calls, monthly contracts, vouchers
    and a few cities and regions raise the odds of churning.

    Args:
        dest: A ``.csv`` file path, or a folder (then ``<dest>/churn.csv``).
        ds: The day (``YYYY-MM-DD``); seeds the generator.
        rows: About how many rows (varies by a few percent per day).

    Returns:
        The CSV file written.

    Raises:
        StagingError: If ``ds`` is not a date.
    """
    day = _day(ds, "synthetic_churn")
    path = dest if dest.suffix == ".csv" else dest / "churn.csv"
    rng = random.Random(day.toordinal() * 7919 + 17)
    n = rows + rng.randint(-rows // 20, rows // 20)
    cities = list(range(1, CHURN_CITIES + 1))
    city_weights = [1.0 / c**1.1 for c in cities]
    channels = churn_channel_weights(day)
    lines = [
        "customer_id,tenure_months,monthly_charges,total_spend,support_calls,plan,"
        "contract_type,payment_method,channel,city,region_code,churned"
    ]
    for i in range(n):
        tenure = min(int(rng.expovariate(1 / 20)), 72)
        charges = round(rng.uniform(15, 130), 2)
        spend = round(tenure * charges * rng.uniform(0.85, 1.05), 2)
        calls = min(int(rng.expovariate(1 / 2.0)), 15)
        plan = rng.choices(("basic", "standard", "premium"), weights=(5, 3, 2))[0]
        contract = rng.choices(("monthly", "yearly", "two_year"), weights=(5, 3, 2))[0]
        payment = rng.choices(("card", "bank", "paypal", "voucher"), weights=(4, 3, 2, 1))[0]
        channel = rng.choices(CHURN_CHANNELS, weights=channels)[0]
        city = rng.choices(cities, weights=city_weights)[0]
        region = rng.choice(tuple(_CHURN_REGION))
        contract_missing = rng.random() < 0.05
        score = (
            -1.5
            - 0.06 * tenure
            + 0.025 * (charges - 70)
            + 0.35 * calls
            + (1.2 if contract == "monthly" else -0.9 if contract == "two_year" else 0.0)
            + (0.5 if contract_missing else 0.0)
            + (0.4 if plan == "basic" else 0.0)
            + (0.7 if payment == "voucher" else 0.0)
            + _CHURN_CITY_EFFECT.get(city, 0.0)
            + _CHURN_REGION[region]
        )
        churned = 1 if rng.random() < 1.0 / (1.0 + math.exp(-score)) else 0
        charges_cell = "" if rng.random() < 0.04 else f"{charges:.2f}"
        roll = rng.random()
        spend_cell = "null" if roll < 0.02 else "NA" if roll < 0.03 else f"{spend:.2f}"
        city_cell = "" if rng.random() < 0.03 else f"city_{city:03d}"
        lines.append(
            f"{ds[:10]}-{i:05d},{tenure},{charges_cell},{spend_cell},{calls},{plan},"
            f"{'NA' if contract_missing else contract},{payment},{channel},{city_cell},"
            f"{region},{churned}"
        )
    return _write_csv(path, lines)


BOOTSTRAPS: dict[str, Callable[[Path, str | None], Path]] = {
    "sklearn_digits": lambda dest, ds: sklearn_digits(dest),
    "synthetic_transactions": lambda dest, ds: synthetic_transactions(
        dest, ds or dt.date.today().isoformat()
    ),
    "synthetic_churn": lambda dest, ds: synthetic_churn(dest, ds or dt.date.today().isoformat()),
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
