"""Pass/fail tolerances of the validation: a :class:`Tolerance` per output,
the defaults per low dtype, and the run's and each output's from the
validation options."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .errors import AmpError, UsageError
from .options import ERROR_STATS, ValidationOptions

# The statistic of an output's elementwise absolute errors that is judged
# against its limit (Polygraphy's --check-error-stat): "max" is every value.
DEFAULT_QUANTILE = 0.99


@dataclass(frozen=True)
class Tolerance:
    """Pass/fail thresholds for one output.

    A float output passes when its NaN/Inf are those of the reference
    (none new, none made finite),
    ``stat(|ref - cand|) <= atol + rtol * max|ref|`` and ``cosine >= min_cosine``
    (not judged when every reference value lies within atol of zero);
    an integer or bool output when at least ``min_equal`` of its elements
    are equal. With ``min_top1``, a float output whose last axis has 2 or
    more entries also needs its argmax along that axis to agree with the
    reference's in at least that share of its rows.

    ``stat`` is ``error_stat`` (ERROR_STATS) of the absolute errors of
    every finite value of every sample: the max by default (each value
    within the limit), or their mean, median or ``quantile`` (in (0, 1],
    DEFAULT_QUANTILE when None; given only with "quantile"). The limit is
    the same whatever the statistic. Invalid values raise AmpError.
    """

    atol: float
    rtol: float
    min_cosine: float
    min_equal: float = 0.99
    # Least top-1 agreement along the last axis of a float output (None: not judged).
    min_top1: float | None = None
    error_stat: str = "max"
    quantile: float | None = None

    def __post_init__(self) -> None:
        if self.error_stat not in ERROR_STATS:
            raise AmpError(f"unknown error statistic {self.error_stat!r}: use one of {', '.join(ERROR_STATS)}")
        if self.quantile is not None:
            if not 0.0 < self.quantile <= 1.0:  # (NaN fails too)
                raise AmpError(f"error quantile {self.quantile!r}: must be in (0, 1]")
            if self.error_stat != "quantile":
                raise AmpError(
                    f"an error quantile ({self.quantile:g}) applies to the statistic quantile only, not {self.error_stat}"
                )

    @property
    def q(self) -> float:
        """The quantile judged (where the statistic is one)."""
        return DEFAULT_QUANTILE if self.quantile is None else self.quantile

    @property
    def stat_key(self) -> str:
        """The check's name in ``checks`` and the reports: max_abs_err (as ever), mean_abs_err, ..."""
        return f"{self.error_stat}_abs_err"

    @property
    def stat_label(self) -> str:
        """The statistic as the terminal says it: "max abs error", "median abs error", "p99 abs error"."""
        name = f"p{self.q * 100:g}" if self.error_stat == "quantile" else self.error_stat
        return f"{name} abs error"

    def as_dict(self) -> dict:
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "min_cosine": self.min_cosine,
            "min_equal": self.min_equal,
            "min_top1": self.min_top1,
            "error_stat": self.error_stat,
            "quantile": self.q if self.error_stat == "quantile" else None,
        }


# What a per-output tolerance may set: number fields and the range each value
# must lie in (its bounds included, but for quantile's 0), and the statistic.
TOLERANCE_FIELDS = {
    "atol": (0.0, math.inf),
    "rtol": (0.0, math.inf),
    "min_cosine": (-1.0, 1.0),
    "min_top1": (0.0, 1.0),
    "quantile": (0.0, 1.0),
    "error_stat": ERROR_STATS,
}


def parse_tolerances(values: Sequence[str]) -> dict[str, dict[str, float | str]]:
    """Per-output tolerances, each ``NAME:field=value,...`` (fields of
    TOLERANCE_FIELDS; the ones left out keep the run's tolerance): output
    name -> the fields given. Raises AmpError naming the bad entry."""
    found: dict[str, dict[str, float | str]] = {}
    for text in values:
        name, sep, spec = text.rpartition(":")
        if not sep or not name or not spec:
            raise AmpError(f"tolerance {text!r}: expected NAME:atol=...,rtol=...,min_cosine=...,min_top1=...,error_stat=...")
        fields = found.setdefault(name, {})
        for item in spec.split(","):
            key, eq, raw = item.strip().partition("=")
            key = key.strip().replace("-", "_")
            if key not in TOLERANCE_FIELDS or not eq:
                raise AmpError(f"tolerance {text!r}: {item.strip()!r} is not one of {', '.join(TOLERANCE_FIELDS)} = value")
            if key == "error_stat":
                if raw.strip() not in ERROR_STATS:
                    raise AmpError(f"tolerance {text!r}: error_stat is one of {', '.join(ERROR_STATS)}, not {raw.strip()!r}")
                fields[key] = raw.strip()
                continue
            try:
                value = float(raw)
            except ValueError:
                raise AmpError(f"tolerance {text!r}: {key} takes a number, not {raw.strip()!r}") from None
            low, high = TOLERANCE_FIELDS[key]
            if key == "quantile" and not 0.0 < value <= 1.0:
                raise AmpError(f"tolerance {text!r}: quantile must be a number in (0, 1]")
            if not (math.isfinite(value) and low <= value <= high):
                raise AmpError(f"tolerance {text!r}: {key} must be a finite number in [{low:g}, {high:g}]")
            fields[key] = value
    return found


# fp16 keeps 11 significant bits (unit roundoff 4.9e-4); errors add up over
# layers, so 1% of an output's range with cosine 0.999 separates rounding
# noise from real damage. bf16 keeps 8 bits (3.9e-3): five times looser.
DEFAULT_TOLERANCES = {
    "fp16": Tolerance(atol=1e-3, rtol=1e-2, min_cosine=0.999, min_equal=0.99),
    "bf16": Tolerance(atol=1e-2, rtol=5e-2, min_cosine=0.99, min_equal=0.98),
}


def output_tolerances(options: ValidationOptions) -> dict[str, dict[str, float]]:
    """``options.tolerance`` as output name -> the fields it sets; raises
    UsageError on a malformed entry."""
    given = options.tolerance
    if isinstance(given, Mapping):
        texts = [f"{name}:" + ",".join(f"{k}={v}" for k, v in fields.items()) for name, fields in given.items()]
    else:
        texts = list(given)
    try:
        return parse_tolerances(texts)
    except AmpError as e:
        raise UsageError(f"`tolerance`: {e}", "tolerance") from None


def run_tolerance(options: ValidationOptions, dtype: str) -> Tolerance | None:
    """The run's tolerance: the fields ``options`` gives over ``dtype``'s
    defaults (None when it gives none: every output takes the defaults)."""
    o = options
    if all(getattr(o, k) is None for k in ("atol", "rtol", "min_cosine", "min_top1", "check_error_stat")):
        return None
    base = DEFAULT_TOLERANCES[dtype]
    return Tolerance(
        atol=base.atol if o.atol is None else o.atol,
        rtol=base.rtol if o.rtol is None else o.rtol,
        min_cosine=base.min_cosine if o.min_cosine is None else o.min_cosine,
        min_equal=base.min_equal,
        min_top1=o.min_top1,
        error_stat=o.check_error_stat or "max",
        quantile=o.error_quantile,
    )


def per_output_tolerances(
    tolerance: Tolerance, fields: Mapping[str, Mapping[str, float | str]], outputs: Sequence[str]
) -> dict[str, Tolerance]:
    """Each output's own tolerance: ``tolerance`` with the ``fields`` it
    sets (output name -> field -> value, as :func:`output_tolerances`). A
    statistic of its own drops the run's quantile unless it is a quantile
    too.

    Raises:
        AmpError: a name that is not one of ``outputs``, or a combination
            that means nothing (a quantile for a statistic that is no
            quantile), the output named.
    """
    unknown = sorted(set(fields) - set(outputs))
    if unknown:
        raise AmpError(
            f"tolerance for {', '.join(map(repr, unknown))}: not an output of the model (its outputs: {', '.join(outputs)})"
        )
    own = {}
    for name, given in fields.items():
        if given.get("error_stat", "quantile") != "quantile" and "quantile" not in given:
            given = {**given, "quantile": None}
        try:
            own[name] = replace(tolerance, **given)
        except AmpError as e:
            raise AmpError(f"tolerance for {name!r}: {e}") from None
    return own
