"""Error metrics between a reference (fp32) tensor and a candidate, gathered
in one streaming pass over samples: each update folds one sample in and the
arrays can be dropped.

Outputs that are not tensors compare by what they hold: an optional's value
where both models have one (empty in both is equal), a map's values key by
key, and a sequence's elements one by one, each an output of its own
(``out[0]``, ``out[1]``, ...: :class:`SequenceStats`; past ELEMENT_ROWS
elements one row stands for them all, :class:`ElementSummary`). Where their
structure differs (a length, presence, the keys) the sample fails.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np

from .errors import AmpError, UsageError
from .options import ERROR_STATS, ValidationOptions
from .order_stats import LargestValues, Quantile

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float(dtype: np.dtype) -> bool:
    """numpy floats, and bfloat16 (an ml_dtypes type numpy sees as kind 'V')."""
    return dtype.kind in "fc" or dtype == _BFLOAT16


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


WarningKind = Literal["all_zeros", "mixed_scales"]

# How many of an output's largest errors are kept, to count those over its
# limit (known only once every sample is in); beyond that it says "at least".
OVER_KEPT = 1 << 16
# For an output judged by its median or a quantile, how many (float64, 32
# MiB): exact while the statistic's order statistics are among them, else
# bounded by a histogram (order_stats.py).
QUANTILE_KEPT = 1 << 22


@dataclass(frozen=True)
class OutputWarning:
    """Something a person should see about an output that passes. The
    reports tell the kinds apart by ``kind`` (the terminal's WARN row), not
    by the wording of ``text``, which is free to change."""

    kind: WarningKind
    text: str


# The mixed-scale warning keeps, per axis of an output, a maximum per index:
# for axes of at most this many indices, outputs of at most this many values.
AXIS_INDICES = 4096
AXIS_ELEMENTS = 1 << 24
# An index's largest value is a scale only over enough values (the other
# axes' and the samples'): over one or two (a decoder step's logits, one
# value per vocabulary index in each sample) it is the value itself, and a
# logit that happens to lie near 0 is no part of another scale.
AXIS_MIN_VALUES = 8


@dataclass
class StructureDiffs:
    """Samples whose values differ in structure between the models (a
    sequence's length, an optional's presence, a map's keys): there is
    nothing to compare value by value, so each is a failure."""

    count: int = 0
    first: str = ""  # the first, described with its sample

    def add(self, sample: int, what: str) -> None:
        self.count += 1
        self.first = self.first or f"sample {sample}: {what}"

    @property
    def reason(self) -> str:
        return self.first if self.count == 1 else f"{self.first} ({self.count} samples differ)"


def _presence(ref: Any, cand: Any) -> str | None:
    """How an optional value's presence differs between the models (None: it does not)."""
    if (ref is None) == (cand is None):
        return None
    return "empty in fp32, present in the converted model" if ref is None else "present in fp32, empty in the converted model"


def _map_values(ref: Any, cand: Any, dtype: np.dtype | None) -> tuple[np.ndarray, np.ndarray] | str:
    """A map's values in both models, in key order (the reference's in
    ``dtype``, its declared value type: onnxruntime gives a ZipMap's float32
    values as Python floats); or how their keys differ."""
    if ref.keys() != cand.keys():
        shared = len(ref.keys() & cand.keys())
        return f"the map's keys differ ({len(ref)} in fp32, {len(cand)} in the converted model, {shared} shared)"
    keys = sorted(ref)
    return np.array([ref[k] for k in keys], dtype=dtype), np.array([cand[k] for k in keys])


class ErrorStats:
    """Streaming comparison of one tensor across samples (also an optional
    tensor's, or a map's values: see :meth:`update`).

    ``detailed=False`` (intermediate tensors of the per-node diff) keeps only
    what the relative RMS error needs, at a fraction of the cost;
    ``map_values``: the declared type of a map output's values;
    ``quantiles``: keep what an exact median or quantile of the errors needs
    (QUANTILE_KEPT of the largest, and a histogram past them), for an
    output judged by one; else OVER_KEPT, and such a statistic is only
    bounded (by 0 and the smallest kept) once more values came.
    """

    def __init__(self, name: str, detailed: bool = True, map_values: np.dtype | None = None, quantiles: bool = False):
        self.name = name
        self.detailed = detailed
        self.map_values = map_values
        self.quantiles = quantiles
        self.element: tuple[str, int] | None = None  # (sequence, index) where this is a sequence's element
        self.kind = ""  # "float" or "exact"
        self.dtype = ""
        self.count = 0
        self.samples = 0
        self.shape_mismatch = 0
        self.structure = StructureDiffs()
        self.empty = 0  # samples where an optional output is empty in both models (equal)
        self.sum_abs_err = 0.0
        self.sum_sq_err = 0.0
        self.sum_sq_ref = 0.0
        self.sum_sq_cand = 0.0
        self.dot = 0.0
        self.max_abs_err = 0.0
        self.max_abs_ref = 0.0
        self.max_rel_err = 0.0
        self.ref_nan = self.ref_inf = self.cand_nan = self.cand_inf = 0
        self.new_nonfinite = 0  # candidate NaN/Inf where the reference is finite
        self.lost_nonfinite = 0  # reference NaN/Inf where the candidate is finite
        self.equal = 0
        # Per axis of the output (see _update_axes): per index, the largest |ref| and |error|
        self._axes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._axes_shape: tuple[int, ...] | None = None  # the shape they are kept for (() once shapes differ)
        self._axes_samples = 0  # the samples folded into them
        # The largest absolute errors so far (and with quantiles, a histogram of them all)
        self._errors = LargestValues(QUANTILE_KEPT, histogram=True) if quantiles else LargestValues(OVER_KEPT)
        self.top1_rows = 0  # rows along the last axis compared by their argmax
        self.top1_agree = 0

    def update(self, ref: Any, cand: Any, sample: int | None = None) -> None:
        """Fold in one sample: two arrays; an optional's values (None: empty);
        or two maps, compared by key (their values as arrays in key order).
        ``sample``: its number among all samples, where this output is not
        in every one (a sequence's element) and a mismatch must name it."""
        self.samples += 1
        if ref is None and cand is None:
            self.empty += 1
            return
        if ref is None or cand is None or isinstance(ref, dict) or isinstance(cand, dict):
            pair = _presence(ref, cand) or _map_values(ref, cand, self.map_values)
            if isinstance(pair, str):
                self.structure.add(sample or self.samples, pair)
                return
            ref, cand = pair
        ref, cand = np.asarray(ref), np.asarray(cand)
        self.dtype = self.dtype or str(ref.dtype)
        self.kind = self.kind or ("float" if is_float(ref.dtype) else "exact")
        if ref.shape != cand.shape:
            self.shape_mismatch += 1
            return
        if not is_float(ref.dtype):
            self.count += ref.size
            self.equal += int(np.count_nonzero(ref == cand))
            return
        # Float outputs compare in float64 whatever their dtypes (an fp16 or
        # bf16 output of one model against float32 of the other).
        if not self.detailed:
            self._update_rms(ref.ravel(), cand.ravel())
            return
        r = ref.astype(np.float64, copy=False).ravel()
        c = cand.astype(np.float64, copy=False).ravel()
        r_fin, c_fin = np.isfinite(r), np.isfinite(c)
        self.ref_nan += int(np.count_nonzero(np.isnan(r)))
        self.ref_inf += int(np.count_nonzero(np.isinf(r)))
        self.cand_nan += int(np.count_nonzero(np.isnan(c)))
        self.cand_inf += int(np.count_nonzero(np.isinf(c)))
        self.new_nonfinite += _new_nonfinite(r, c, r_fin, c_fin)
        self.lost_nonfinite += int(np.count_nonzero(~r_fin & c_fin))
        both = r_fin & c_fin
        if not both.all():
            r, c = r[both], c[both]
        self.count += r.size
        if r.size == 0:
            return
        err = np.abs(r - c)
        abs_r = np.abs(r)
        if ref.ndim >= 2 and r.size == ref.size:  # (every value finite: the arrays keep the output's shape)
            self._update_axes(ref.shape, abs_r, err)
        self._errors.add(err)
        if ref.ndim >= 1 and ref.shape[-1] >= 2:
            self._update_top1(ref, cand)
        scale = float(abs_r.max())
        self.max_abs_ref = max(self.max_abs_ref, scale)
        self.max_abs_err = max(self.max_abs_err, float(err.max()))
        self.sum_abs_err += float(err.sum())
        self.sum_sq_err += float(err @ err)
        self.sum_sq_ref += float(r @ r)
        self.sum_sq_cand += float(c @ c)
        self.dot += float(r @ c)
        # Relative to each element, floored at 1e-3 of the sample's range so
        # values near zero do not dominate.
        floor = max(scale * 1e-3, np.finfo(np.float32).tiny)
        self.max_rel_err = max(self.max_rel_err, float((err / np.maximum(abs_r, floor)).max()))

    def _update_top1(self, ref: np.ndarray, cand: np.ndarray) -> None:
        """Count the rows (along the last axis) whose argmax the candidate keeps."""
        r = np.argmax(ref.astype(np.float32, copy=False), axis=-1)
        c = np.argmax(cand.astype(np.float32, copy=False), axis=-1)
        self.top1_rows += int(r.size)
        self.top1_agree += int(np.count_nonzero(r == c))

    @property
    def top1_agreement(self) -> float | None:
        """The share of rows whose argmax along the last axis agrees (None: no such rows)."""
        return self.top1_agree / self.top1_rows if self.top1_rows else None

    def over_limit(self, tol: Tolerance) -> tuple[int, bool]:
        """How many values' errors exceed the limit ``tol`` allows, and
        whether that is a lower bound (more than the kept errors did)."""
        return self._errors.count_above(self.limit_abs_err(tol))

    def error_stat(self, tol: Tolerance) -> Quantile:
        """``tol``'s statistic of the absolute errors of every finite value
        compared (0 where there is none): the max and mean exactly (the
        mean from float64 sums), a median or quantile exactly where its
        order statistics are kept (see ``quantiles``), else as an interval
        whose upper end is the value judged."""
        if tol.error_stat == "max":
            return Quantile(self.max_abs_err)
        if tol.error_stat == "mean":
            return Quantile(self.sum_abs_err / self.count if self.count else 0.0)
        if tol.error_stat == "median":
            return self._errors.median()
        return self._errors.quantile(tol.q)

    def over_limit_text(self, tol: Tolerance) -> str:
        """The count of values over the limit, said against all of them ("2,035 of 409,600 values")."""
        n, more = self.over_limit(tol)
        return f"{'at least ' if more else ''}{n:,} of {self.count:,} values"

    def _update_axes(self, shape: tuple[int, ...], abs_r: np.ndarray, err: np.ndarray) -> None:
        """Along each axis of 2 to AXIS_INDICES indices, per index: the
        largest |reference| and |error| over the rest of the output (see
        :meth:`_mixed_scales`). Kept while every sample has one shape, for
        outputs of at most AXIS_ELEMENTS values."""
        if self._axes_shape is None:
            self._axes_shape = shape if abs_r.size <= AXIS_ELEMENTS else ()
        if shape != self._axes_shape:
            self._axes_shape, self._axes = (), {}
        if not self._axes_shape:
            return
        self._axes_samples += 1
        abs_r, err = abs_r.reshape(shape), err.reshape(shape)
        for axis, n in enumerate(shape):
            if not 2 <= n <= AXIS_INDICES:
                continue
            rest = tuple(k for k in range(len(shape)) if k != axis)
            found = (abs_r.max(axis=rest), err.max(axis=rest))
            kept = self._axes.setdefault(axis, found)
            if kept is not found:
                np.maximum(kept[0], found[0], out=kept[0])
                np.maximum(kept[1], found[1], out=kept[1])

    def _mixed_scales(self, tol: Tolerance) -> str | None:
        """The tolerance is one per output, at the scale of its largest
        values: where an output packs values of very different scales (a
        detector's box coordinates beside its class scores), a part whose
        values are small next to the rest can be off by much of its own
        range and pass. Along the axis where it is worst, the part (indices)
        whose values stay within a tenth of the output's scale and are off
        by over a tenth of their own, past the tolerance at their own scale,
        described; None where there is none. Only along axes whose indices
        hold AXIS_MIN_VALUES values or more over the samples."""
        worst: tuple[float, int, np.ndarray] | None = None
        size = math.prod(self._axes_shape or ())
        for axis, (scales, errors) in self._axes.items():
            if size // len(scales) * self._axes_samples < AXIS_MIN_VALUES:
                continue
            off = (scales * 10 <= self.max_abs_ref) & (errors > 0.1 * scales) & (errors > tol.atol + tol.rtol * scales)
            if off.any():
                share = float((errors[off] / np.maximum(scales[off], 1e-30)).max())
                if worst is None or share > worst[0]:
                    worst = (share, axis, off)
        if worst is None:
            return None
        share, axis, off = worst
        scales, errors = self._axes[axis]
        where = np.flatnonzero(off)
        one = len(where) == 1
        at = f"index {where[0]}" if one else f"{len(where)} of its {len(off)} indices ({_index_ranges(where)})"
        reach, are, them, their = ("reaches", "is", "it", "its") if one else ("reach", "are", "them", "their")
        part = float(scales[off].max())
        how = f"{share:.0%} of {their} own range" if part > 0 else "where fp32 is 0"
        return (
            f"along axis {axis}, {at} {reach} at most {part:.3g} in fp32 (the output {self.max_abs_ref:.3g}, the scale "
            f"it is judged at) and {are} off by up to {float(errors[off].max()):.3g}, {how}: give a lower --rtol to "
            f"judge {them} at {their} own scale, or validate {them} as an output of {their} own"
        )

    def _update_rms(self, ref: np.ndarray, cand: np.ndarray) -> None:
        # float64: squares of values past 1e19 (attention masks filled with
        # float32's lowest) would overflow float32 sums.
        r = ref.astype(np.float64)
        c = cand.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # (-inf - -inf is NaN: those pairs are left out below)
            diff = r - c
            sq_err = float(np.dot(diff, diff))
        if not math.isfinite(sq_err):
            r_fin, c_fin = np.isfinite(r), np.isfinite(c)
            self.new_nonfinite += _new_nonfinite(r, c, r_fin, c_fin)
            self.lost_nonfinite += int(np.count_nonzero(~r_fin & c_fin))
            both = r_fin & c_fin
            r, diff = r[both], diff[both]
            sq_err = float(np.dot(diff, diff))
        self.count += r.size
        self.sum_sq_err += sq_err
        self.sum_sq_ref += float(np.dot(r, r))

    # ------------------------------------------------------------ derived

    @property
    def cosine(self) -> float:
        if self.sum_sq_err == 0.0:  # (equal outputs: exactly 1, where the quotient rounds to just below it)
            return 1.0
        denom = math.sqrt(self.sum_sq_ref) * math.sqrt(self.sum_sq_cand)
        if denom == 0.0:
            return 0.0
        return max(-1.0, min(1.0, self.dot / denom))

    @property
    def snr_db(self) -> float:
        if self.sum_sq_err == 0.0:
            return math.inf
        if self.sum_sq_ref == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.sum_sq_ref / self.sum_sq_err)

    @property
    def relative_rms(self) -> float:
        """||ref - cand|| / ||ref||: the per-node error measure (inf where NaN/Inf, shapes or structure differ)."""
        if self.new_nonfinite or self.lost_nonfinite or self.shape_mismatch or self.structure.count:
            return math.inf
        if self.sum_sq_ref == 0.0:
            return 0.0 if self.sum_sq_err == 0.0 else math.inf
        return math.sqrt(self.sum_sq_err / self.sum_sq_ref)

    @property
    def equal_fraction(self) -> float:
        return self.equal / self.count if self.count else 1.0

    def checks(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> dict[str, bool]:
        """Each criterion of ``tol`` (``only``: just these) and whether this output meets it."""
        if self.structure.count:
            every = {"structure": False}
        elif self.shape_mismatch:
            every = {"shape": False}
        elif not self.kind and self.empty:  # (an optional empty in both models in every sample)
            every = {"structure": True}
        elif self.kind == "exact":
            every = {"equal_fraction": self.equal_fraction >= tol.min_equal}
        else:
            every = {
                "nonfinite": self.new_nonfinite == 0 and self.lost_nonfinite == 0,
                tol.stat_key: self.error_stat(tol).value <= self.limit_abs_err(tol),
                # Cosine says nothing about outputs that lie within atol of zero...
                "cosine": self.cosine >= tol.min_cosine or self.max_abs_ref <= tol.atol,
            }
            if tol.min_top1 is not None and self.top1_rows:
                every["top1"] = self.top1_agree >= tol.min_top1 * self.top1_rows
        return _only(every, only)

    def warnings(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> list[OutputWarning]:
        """What passes the tolerance but a person should still see (``tol``:
        the tolerance judged, which the mixed-scale warning needs; ``only``:
        its checks judged). An output that fails it has its failures, no
        warning (an all-zeros one says it passes)."""
        if self.kind != "float" or (tol is not None and self.verdict(tol, only)):
            return []
        if self.sum_sq_ref > 0 and self.sum_sq_cand == 0:
            text = (
                f"every value became 0 (fp32 reaches {self.max_abs_ref:.3g}); it passes only because the whole "
                "output is within --atol of 0: lower --atol to judge it"
            )
            return [OutputWarning("all_zeros", text)]
        mixed = self._mixed_scales(tol) if tol is not None else None
        return [OutputWarning("mixed_scales", mixed)] if mixed else []

    def limit_abs_err(self, tol: Tolerance) -> float:
        """The largest absolute error ``tol`` allows this output."""
        return tol.atol + tol.rtol * self.max_abs_ref

    def records(self, tol: Tolerance) -> list[ErrorStats]:
        """The report's rows for this output: itself (see :meth:`SequenceStats.records`)."""
        return [self]

    def verdict(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> list[str]:
        """Reasons this output fails ``tol`` (empty: it passes); ``only``: judge just these checks."""
        checks = self.checks(tol, only)
        reasons = {
            "structure": self.structure.reason,
            "shape": f"shape differs in {self.shape_mismatch} sample(s)",
            "equal_fraction": f"{self.equal_fraction:.4f} equal < {tol.min_equal}",
            "nonfinite": "; ".join(
                text
                for count, text in (
                    (self.new_nonfinite, f"{self.new_nonfinite} new NaN/Inf values"),
                    (self.lost_nonfinite, f"{self.lost_nonfinite} NaN/Inf values of the reference made finite"),
                )
                if count
            ),
            tol.stat_key: f"{tol.stat_label} {self._stat_text(tol)} > {self.limit_abs_err(tol):.3g} "
            f"({self.over_limit_text(tol)} over it{self._top1_text()})",
            "cosine": f"cosine {self.cosine:.5f} < {tol.min_cosine}",
            "top1": f"top-1 agreement {self.top1_agreement or 0:.4%} < {tol.min_top1}",
        }
        return [reasons[name] for name, ok in checks.items() if not ok]

    def _stat_text(self, tol: Tolerance) -> str:
        """The statistic's value, "~" before one only bounded (its upper end)."""
        found = self.error_stat(tol)
        return f"{found.value:.3g}" if found.exact else f"~{found.value:.3g}"

    def _top1_text(self) -> str:
        agreement = self.top1_agreement
        return "" if agreement is None else f"; top-1 agreement {agreement:.4%}"

    def as_dict(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> dict:
        """The metrics, and with ``tol`` the verdict (``only``: on just these checks).
        kind "empty": no sample had values in both models (an optional
        output, empty in one or both), so there are no metrics."""
        kind = self.kind or ("empty" if self.empty or self.structure.count else "float")
        d: dict = {"name": self.name, "dtype": self.dtype, "kind": kind, "samples": self.samples, **_element_fields(self)}
        if self.shape_mismatch:
            d["shape_mismatch"] = self.shape_mismatch
        if self.structure.count:
            d["structure_mismatch"] = self.structure.count
        if self.empty:
            d["empty"] = self.empty
        if kind == "exact":
            d["equal_fraction"] = self.equal_fraction
        elif kind == "float":
            d.update(
                max_abs_err=self.max_abs_err,
                mean_abs_err=self.sum_abs_err / self.count if self.count else 0.0,
                max_rel_err=self.max_rel_err,
                cosine=self.cosine,
                snr_db=_finite_or_none(self.snr_db),
                max_abs_ref=self.max_abs_ref,
                ref_nan=self.ref_nan,
                ref_inf=self.ref_inf,
                cand_nan=self.cand_nan,
                cand_inf=self.cand_inf,
                new_nonfinite=self.new_nonfinite,
                lost_nonfinite=self.lost_nonfinite,
                values=self.count,
                top1_agreement=self.top1_agreement,
                top1_rows=self.top1_rows,
            )
            if tol is not None:
                d["values_over_limit"], d["values_over_limit_at_least"] = self.over_limit(tol)
                found = self.error_stat(tol)
                d["error_stat"] = {
                    "name": tol.error_stat,
                    "quantile": tol.q if tol.error_stat == "quantile" else None,
                    "value": found.value,
                    "exact": found.exact,
                    # (an inexact one: the interval that holds it; the value judged is its upper end)
                    "bounds": None if found.exact else [found.low, found.high],
                }
        if tol is not None:
            failures = self.verdict(tol, only)
            d["passed"] = not failures
            d["failures"] = failures
            d["checks"] = self.checks(tol, only)
            d["limit_abs_err"] = self.limit_abs_err(tol)
        warnings = self.warnings(tol, only)
        d["warnings"] = [w.text for w in warnings]
        d["warning_kinds"] = [w.kind for w in warnings]  # (one per warning, in its order)
        return d


# A sequence of more elements than this reports them as one row (ElementSummary),
# listing at most this many of the worst failing ones beside it.
ELEMENT_ROWS = 16


class SequenceStats:
    """Streaming comparison of a sequence output (or an optional one) across
    samples: its length in both models, and each element as an output of
    its own, ``name[i]`` (an :class:`ErrorStats`, or a SequenceStats for a
    sequence of sequences), judged by the same tolerance. A sample whose
    lengths differ, or that is empty in one model only, fails the sequence
    and compares no elements: which of them would pair up is anyone's guess.

    ``taken``: the report's row names so far, shared by every output, so
    that an element's row never takes a name another row has (an output
    literally named ``out[0]``); ``map_values``: the declared type of its
    maps' values; ``quantiles``: its elements' (see :class:`ErrorStats`).
    """

    kind = dtype = "sequence"

    def __init__(self, name: str, taken: set[str] | None = None, map_values: np.dtype | None = None, quantiles: bool = False):
        self.name = name
        self.taken = {name} if taken is None else taken
        self.map_values = map_values
        self.quantiles = quantiles
        self.element: tuple[str, int] | None = None  # (sequence, index) where this is a sequence's element
        self.samples = 0
        self.structure = StructureDiffs()
        self.empty = 0  # samples where an optional sequence is empty in both models (equal)
        self.absent = False  # whether it was empty (an optional's None) in either model in some sample
        self.lengths: tuple[int, int] | None = None  # fewest and most elements, over the samples compared
        self.elements: dict[int, ErrorStats | SequenceStats] = {}
        self._summary_name = ""

    def update(self, ref: Any, cand: Any, sample: int | None = None) -> None:
        """Fold in one sample (``sample``: its number among all, as :meth:`ErrorStats.update`)."""
        self.samples += 1
        sample = sample or self.samples
        self.absent = self.absent or ref is None or cand is None
        if ref is None and cand is None:
            self.empty += 1
            return
        differs = _presence(ref, cand)
        if differs is None and len(ref) != len(cand):
            differs = f"{len(ref)} element(s) in fp32, {len(cand)} in the converted model"
        if differs is not None:
            self.structure.add(sample, differs)
            return
        n = len(ref)
        self.lengths = (n, n) if self.lengths is None else (min(self.lengths[0], n), max(self.lengths[1], n))
        for i, (r, c) in enumerate(zip(ref, cand, strict=True)):
            element = self.elements.get(i)
            if element is None:
                name = self._unique(f"{self.name}[{i}]")
                if isinstance(r, list):
                    element = SequenceStats(name, self.taken, self.map_values, self.quantiles)
                else:
                    element = ErrorStats(name, map_values=self.map_values, quantiles=self.quantiles)
                element.element = (self.name, i)
                self.elements[i] = element
            element.update(r, c, sample)

    def _unique(self, name: str) -> str:
        """``name``, or where another row has it (an output so named) a variant no row has."""
        base, k = name, 1
        while name in self.taken:
            k += 1
            name = f"{base} (element)" if k == 2 else f"{base} (element {k - 1})"
        self.taken.add(name)
        return name

    def records(self, tol: Tolerance) -> list[ErrorStats | SequenceStats | ElementSummary]:
        """This sequence and its elements (theirs after each), in index order:
        one report row each. Past ELEMENT_ROWS elements (a classifier's
        ZipMap gives one per row of a batch), one row for them all and rows
        for the worst failing ones only."""
        found: list[ErrorStats | SequenceStats | ElementSummary] = [self]
        if len(self.elements) <= ELEMENT_ROWS:
            shown = [e for _, e in sorted(self.elements.items())]
        else:
            self._summary_name = self._summary_name or self._unique(f"{self.name}[*]")
            summary = ElementSummary(self._summary_name, self, tol)
            found.append(summary)
            shown = summary.listed
        for element in shown:
            found += element.records(tol)
        return found

    @property
    def relative_rms(self) -> float:
        """Its worst element's (the per-node diff's measure of the node that makes it); inf where the structure differs."""
        if self.structure.count:
            return math.inf
        return max((e.relative_rms for e in self.elements.values()), default=0.0)

    def checks(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> dict[str, bool]:
        """Its own check is the structure's: its elements are judged as outputs of their own."""
        every = {"structure": not self.structure.count}
        return _only(every, only)

    def verdict(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> list[str]:
        return [self.structure.reason] if not self.checks(tol, only).get("structure", True) else []

    def warnings(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> list[OutputWarning]:
        return []

    def as_dict(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> dict:
        """kind "empty" (as an optional tensor's) where no sample held it in both models."""
        kind = "empty" if self.absent and self.lengths is None else self.kind
        d: dict = {"name": self.name, "dtype": self.dtype, "kind": kind, "samples": self.samples, **_element_fields(self)}
        if self.structure.count:
            d["structure_mismatch"] = self.structure.count
        if self.empty:
            d["empty"] = self.empty
        if self.lengths is not None:
            d["lengths"] = list(self.lengths)
        if tol is not None:
            failures = self.verdict(tol, only)
            d.update(passed=not failures, failures=failures, checks=self.checks(tol, only))
        d["warnings"], d["warning_kinds"] = [], []
        return d


def _only(checks: dict[str, bool], only: tuple[str, ...] | None) -> dict[str, bool]:
    """``checks``, of the criteria ``only`` names (None: all)."""
    return checks if only is None else {k: ok for k, ok in checks.items() if k in only}


class ElementSummary:
    """One report row for the elements of a long sequence: how many pass,
    the worst (failing before passing, then furthest past its limit:
    :func:`_badness`), and the ELEMENT_ROWS worst failing ones, in index
    order, to list beside it. Only those few are kept."""

    kind = "elements"

    def __init__(self, name: str, sequence: SequenceStats, tol: Tolerance):
        self.name = name
        self.sequence = sequence
        self.count = len(sequence.elements)
        self.failed = 0
        worst = (False, -1.0, 0)
        failing: list[tuple[float, int]] = []  # (badness, -index) of the worst failing ones, a min-heap
        for i, element in sequence.elements.items():
            fails = _fails(element, tol)
            key = (fails, _badness(element, tol), -i)
            worst = max(worst, key)
            if fails:
                self.failed += 1
                (heapq.heappush if len(failing) < ELEMENT_ROWS else heapq.heappushpop)(failing, key[1:])
        self.worst = sequence.elements[-worst[2]]
        self.listed = [sequence.elements[i] for i in sorted(-minus_index for _, minus_index in failing)]
        self.dtypes = sorted({e.dtype for e in sequence.elements.values()} - {""})
        self._worst_detail = _detail(self.worst, tol)

    def checks(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> dict[str, bool]:
        every = {"elements": not self.failed}
        return _only(every, only)

    def verdict(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> list[str]:
        if self.checks(tol, only).get("elements", True):
            return []
        reason = f"{self.failed} of {self.count} elements fail, the worst {self.worst.name} ({self._worst_detail})"
        if self.failed > len(self.listed):
            reason += f"; the {len(self.listed)} worst are listed, {self.failed - len(self.listed)} more are not"
        return [reason]

    def warnings(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> list[OutputWarning]:
        return []

    def as_dict(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> dict:
        worst = {"name": self.worst.name, "index": self.worst.element[1], "detail": self._worst_detail}
        elements = {"count": self.count, "passed": self.count - self.failed, "failed": self.failed, "listed": len(self.listed)}
        failures = self.verdict(tol, only)
        return {
            "name": self.name,
            "dtype": ",".join(self.dtypes),
            "kind": self.kind,
            "samples": self.sequence.samples,
            "element_of": self.sequence.name,
            "elements": {**elements, "worst": worst},
            "passed": not failures,
            "failures": failures,
            "checks": self.checks(tol, only),
            "warnings": [],
            "warning_kinds": [],
        }


def _fails(stats: ErrorStats | SequenceStats, tol: Tolerance) -> bool:
    """Whether an element, or anything in it, fails ``tol``."""
    if isinstance(stats, ErrorStats):
        return bool(stats.verdict(tol))
    return bool(stats.verdict(tol)) or any(_fails(e, tol) for e in stats.elements.values())


def _badness(stats: ErrorStats | SequenceStats, tol: Tolerance) -> float:
    """How far an element lies past its tolerance (1: at the limit), to name
    the worst of many: inf where its structure, shape or NaN/Inf differ."""
    if isinstance(stats, SequenceStats):
        return math.inf if stats.structure.count else max((_badness(e, tol) for e in stats.elements.values()), default=0.0)
    if stats.structure.count or stats.shape_mismatch or stats.new_nonfinite or stats.lost_nonfinite:
        return math.inf
    if stats.kind == "exact":
        off, allowed = 1.0 - stats.equal_fraction, 1.0 - tol.min_equal
    elif stats.kind == "float":
        off, allowed = stats.error_stat(tol).value, stats.limit_abs_err(tol)
    else:
        return 0.0
    return off / allowed if allowed > 0 else (math.inf if off > 0 else 0.0)


def _detail(stats: ErrorStats | SequenceStats, tol: Tolerance) -> str:
    """An element's worst, in a few words: its first failure, or how close it comes."""
    rows = stats.records(tol)
    for row in rows:
        failures = row.verdict(tol)
        if failures:
            return failures[0] if row is stats else f"{row.name}: {failures[0]}"
    if isinstance(stats, ErrorStats) and stats.kind == "float":
        return f"{tol.stat_label} {stats._stat_text(tol)} <= {stats.limit_abs_err(tol):.3g}"
    if isinstance(stats, ErrorStats) and stats.kind == "exact":
        return f"{stats.equal_fraction:.4f} equal"
    return "as fp32's"


def _element_fields(stats: ErrorStats | SequenceStats) -> dict:
    """Where a row is a sequence's element, which sequence's and its index (its name need not say: see SequenceStats)."""
    return {} if stats.element is None else {"element_of": stats.element[0], "index": stats.element[1]}


def _index_ranges(indices: np.ndarray, most: int = 4) -> str:
    """Sorted indices as runs: "4-83", "0, 2, 5-7" (the first ``most`` runs)."""
    starts = [0, *(np.flatnonzero(np.diff(indices) != 1) + 1).tolist()]
    ends = [*starts[1:], len(indices)]
    runs = [f"{indices[a]}" if b - a == 1 else f"{indices[a]}-{indices[b - 1]}" for a, b in zip(starts, ends, strict=True)]
    return ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")


def _new_nonfinite(r: np.ndarray, c: np.ndarray, r_fin: np.ndarray, c_fin: np.ndarray) -> int:
    """Candidate NaN/Inf values the reference does not have at the same place
    (a NaN where fp32 has Inf, or an Inf of the other sign, counts)."""
    same = (r == c) | (np.isnan(r) & np.isnan(c))
    return int(np.count_nonzero(~c_fin & ~same))


def _finite_or_none(x: float) -> float | None:
    """JSON has no infinity: an infinite SNR is written as null (+inf where
    the outputs are equal, max_abs_err 0; -inf where the reference is all
    zeros and the candidate is not)."""
    return x if math.isfinite(x) else None


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
