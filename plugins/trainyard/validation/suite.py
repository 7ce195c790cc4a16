"""The one translator from a data contract to a great_expectations ``ExpectationSuite``.

Every expectation carries ``meta["trainyard"]`` = ``{"rule", "column", "severity",
"scope"}``. ``scope`` is ``batch`` when the expectation is correct on any slice of the
rows (value checks: counts simply add up across batches), ``dataset`` when it needs the
whole snapshot (uniqueness, row count, presence of every allowed value); the batched
runner computes dataset-scope expectations itself, a whole-frame run lets GX do them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import great_expectations as gx

    from trainyard.contracts import Column, Contract

SCOPES = ("batch", "dataset")


def _meta(rule: str, column: str | None, severity: str, scope: str) -> dict[str, Any]:
    return {"trainyard": {"rule": rule, "column": column, "severity": severity, "scope": scope}}


def _column_expectations(col: Column) -> list[Any]:
    import great_expectations.expectations as gxe

    out: list[Any] = []
    name = col.name
    if not col.nullable:
        sev = col.severity_of("nullable")
        out.append(
            gxe.ExpectColumnValuesToNotBeNull(
                column=name, meta=_meta("nullable", name, sev, "batch")
            )
        )
    bounds = [r for r in ("min", "max") if getattr(col, r) is not None]
    if len(bounds) == 2 and col.severity_of("min") != col.severity_of("max"):
        groups = [["min"], ["max"]]
    else:
        groups = [bounds] if bounds else []
    for group in groups:
        rule = "range" if len(group) == 2 else group[0]
        kwargs: dict[str, Any] = {}
        if "min" in group:
            kwargs.update(min_value=col.min, strict_min=col.min_exclusive)
        if "max" in group:
            kwargs.update(max_value=col.max, strict_max=col.max_exclusive)
        sev = col.severity_of(group[0])
        out.append(
            gxe.ExpectColumnValuesToBeBetween(
                column=name, **kwargs, meta=_meta(rule, name, sev, "batch")
            )
        )
    if col.allowed_values is not None:
        sev = col.severity_of("allowed_values")
        out.append(
            gxe.ExpectColumnValuesToBeInSet(
                column=name,
                value_set=list(col.allowed_values),
                meta=_meta("allowed_values", name, sev, "batch"),
            )
        )
    if col.regex is not None:
        sev = col.severity_of("regex")
        out.append(
            gxe.ExpectColumnValuesToMatchRegex(
                column=name, regex=col.value_regex, meta=_meta("regex", name, sev, "batch")
            )
        )
    if col.min_length is not None or col.max_length is not None:
        declared = [r for r in ("min_length", "max_length") if getattr(col, r) is not None]
        sev = "error" if any(col.severity_of(r) == "error" for r in declared) else "warn"
        out.append(
            gxe.ExpectColumnValueLengthsToBeBetween(
                column=name,
                min_value=col.min_length,
                max_value=col.max_length,
                meta=_meta("length", name, sev, "batch"),
            )
        )
    if col.unique:
        sev = col.severity_of("unique")
        out.append(
            gxe.ExpectColumnValuesToBeUnique(
                column=name, meta=_meta("unique", name, sev, "dataset")
            )
        )
    if col.all_values_present and col.allowed_values is not None:
        sev = col.severity_of("all_values_present")
        out.append(
            gxe.ExpectColumnDistinctValuesToContainSet(
                column=name,
                value_set=list(col.allowed_values),
                meta=_meta("all_values_present", name, sev, "dataset"),
            )
        )
    return out


def build_suite(contract: Contract, scopes: tuple[str, ...] = SCOPES) -> gx.ExpectationSuite:
    """Compile a contract into a GX expectation suite.

    Args:
        contract: The checked contract.
        scopes: Which expectations to include: ``batch`` (value checks), ``dataset``
            (whole-snapshot checks), or both (the complete suite).

    Returns:
        An ``ExpectationSuite`` named ``<dataset>-<version>``; each expectation's
        ``meta["trainyard"]`` names its rule, column, severity and scope.
    """
    import great_expectations as gx
    import great_expectations.expectations as gxe

    expectations: list[Any] = []
    count = contract.rules.row_count
    if count is not None:
        expectations.append(
            gxe.ExpectTableRowCountToBeBetween(
                min_value=count.min,
                max_value=count.max,
                meta=_meta("row_count", None, count.severity, "dataset"),
            )
        )
    for col in contract.columns:
        expectations.extend(_column_expectations(col))
    chosen = [e for e in expectations if e.meta["trainyard"]["scope"] in scopes]
    suite = gx.ExpectationSuite(name=f"{contract.dataset}-{contract.version}", expectations=chosen)
    return suite


def rule_meta(expectation: Any) -> dict[str, Any]:
    """The ``{"rule", "column", "severity", "scope"}`` record of a compiled expectation."""
    return dict(expectation.meta["trainyard"])
