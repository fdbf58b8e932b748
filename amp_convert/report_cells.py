"""How a report's values read in a table cell, the terminal's and the HTML page's alike."""

from __future__ import annotations

import math
from typing import Any


def fmt(x: Any) -> str:
    """A value as a cell shows it: "-" for none, 4 significant digits, "inf"."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return f"{x:.4g}"
    return str(x)


def stat_label(stat: dict) -> str:
    """A judged statistic as the terminal names it: "median abs error", "p99.9 abs error"."""
    name = f"p{stat['quantile'] * 100:g}" if stat["name"] == "quantile" else stat["name"]
    return f"{name} abs error"


def stat_value(stat: dict) -> str:
    """Its value; one only bounded (past the errors kept) shows its upper end, after "~"."""
    return fmt(stat["value"]) if stat["exact"] else f"~{fmt(stat['value'])}"


def structure_differs(out: dict) -> bool:
    """Whether a compared output fails on its structure (a sequence's length, an optional's presence, a map's keys)."""
    return out["checks"].get("structure") is False


def held(out: dict) -> str:
    """What a sequence output held (its lengths) or that an optional one was empty in both models."""
    lengths = out.get("lengths")
    if lengths is None:
        return "empty in both"
    low, high = lengths
    return f"{low} element(s)" if low == high else f"{low}-{high} elements"


def pass_fail(ok: bool) -> str:
    """A check's verdict as shown."""
    return "PASS" if ok else "FAIL"


def snr(output: dict) -> str:
    """An output's SNR as shown: JSON holds an infinite one as null, +inf where
    the outputs are equal, -inf where the reference is all zeros and the
    candidate is not."""
    if output["snr_db"] is not None:
        return fmt(output["snr_db"])
    return "inf" if output["max_abs_err"] == 0 else "-inf"
