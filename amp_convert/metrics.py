"""Error metrics between a reference (fp32) tensor and a candidate, gathered
in one streaming pass over samples: each update folds one sample in and the
arrays can be dropped.

Outputs that are not tensors compare by what they hold: an optional's value
where both models have one (empty in both is equal) and a map's values key
by key (:class:`ErrorStats`); a sequence's elements one by one, each an
output of its own (sequence_stats.py). Where their structure differs (a
length, presence, the keys) the sample fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import ml_dtypes
import numpy as np

from .mixed_scales import AxisScales
from .order_stats import LargestValues, Quantile
from .tolerance import Tolerance

if TYPE_CHECKING:
    from .sequence_stats import SequenceStats

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float(dtype: np.dtype) -> bool:
    """numpy floats, and bfloat16 (an ml_dtypes type numpy sees as kind 'V')."""
    return dtype.kind in "fc" or dtype == _BFLOAT16


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


def presence(ref: Any, cand: Any) -> str | None:
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
        # Per axis of the output, per index: the largest |ref| and |error| (the mixed-scale warning's)
        self.axis_scales = AxisScales()
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
            pair = presence(ref, cand) or _map_values(ref, cand, self.map_values)
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
            self.axis_scales.update(ref.shape, abs_r, err)
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
        return only_checks(every, only)

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
                "output is within `atol` of 0: lower `atol` to judge it"
            )
            return [OutputWarning("all_zeros", text)]
        mixed = self.axis_scales.warning(self.max_abs_ref, tol) if tol is not None else None
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
        d: dict = {"name": self.name, "dtype": self.dtype, "kind": kind, "samples": self.samples, **element_fields(self)}
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


def only_checks(checks: dict[str, bool], only: tuple[str, ...] | None) -> dict[str, bool]:
    """``checks``, of the criteria ``only`` names (None: all)."""
    return checks if only is None else {k: ok for k, ok in checks.items() if k in only}


def element_fields(stats: ErrorStats | SequenceStats) -> dict:
    """Where a row is a sequence's element, which sequence's and its index (its name need not say: see SequenceStats)."""
    return {} if stats.element is None else {"element_of": stats.element[0], "index": stats.element[1]}


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
