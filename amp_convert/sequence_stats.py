"""Sequence outputs compared element by element: a :class:`SequenceStats`
per sequence (each element an output of its own, ``out[0]``, ``out[1]``,
...), and past ELEMENT_ROWS elements one :class:`ElementSummary` row that
stands for them all."""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from .metrics import ErrorStats, OutputWarning, StructureDiffs, element_fields, only_checks, presence
from .tolerance import Tolerance

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
        differs = presence(ref, cand)
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
        return only_checks(every, only)

    def verdict(self, tol: Tolerance, only: tuple[str, ...] | None = None) -> list[str]:
        return [self.structure.reason] if not self.checks(tol, only).get("structure", True) else []

    def warnings(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> list[OutputWarning]:
        return []

    def as_dict(self, tol: Tolerance | None = None, only: tuple[str, ...] | None = None) -> dict:
        """kind "empty" (as an optional tensor's) where no sample held it in both models."""
        kind = "empty" if self.absent and self.lengths is None else self.kind
        d: dict = {"name": self.name, "dtype": self.dtype, "kind": kind, "samples": self.samples, **element_fields(self)}
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
        return only_checks(every, only)

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
