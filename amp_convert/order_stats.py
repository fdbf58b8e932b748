"""Order statistics (median, quantiles) of a stream of non-negative values,
exact within a memory budget and bounded beyond it.

Validation sees an output's errors one sample at a time and cannot keep
them all. :class:`LargestValues` keeps the ``capacity`` largest values seen
(float64, as computed); a quantile whose order statistics fall among them
is exact: numpy's (``np.quantile``'s default "linear" method,
``np.median``), bit for bit. A quantile at ``q`` needs the values of rank
``floor(q * (n - 1))`` and up, about ``(1 - q) * n + 1`` of the largest:
with a capacity of 2**23 a p99 is exact up to ~838M values, a median up to
~16.7M. Past that (``histogram=True``) a count of every value per bin of
its float32 bit pattern, 2**11 bins per power of two, started when the
first value is dropped, bounds the quantile to one bin: relative width
2**-11 (~4.9e-4), reported as an interval whose upper end is the value
judged (conservative: it never passes what the exact value fails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Histogram bins: a non-negative float32's bit pattern shifted right by this
# many bits keeps its exponent and 23 - 12 = 11 mantissa bits.
_BIN_SHIFT = 12
_BINS = (0x7F800000 >> _BIN_SHIFT) + 1  # up to +inf's pattern: 522,241 bins (4 MiB of counts)


@dataclass(frozen=True)
class Quantile:
    """A statistic's value, with ``exact`` False where only the interval
    [``low``, ``high``] that holds it is known (``value`` is then ``high``)."""

    value: float
    exact: bool = True
    low: float = math.nan
    high: float = math.nan


class LargestValues:
    """The ``capacity`` largest of a stream of non-negative finite float64
    values, and how many were seen; with ``histogram``, a per-bin count of
    them all once any is dropped (see the module's docstring)."""

    def __init__(self, capacity: int, histogram: bool = False):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.histogram = histogram
        self.count = 0
        self._parts: list[np.ndarray] = []  # the kept values, in no order, until compacted
        self._held = 0  # values in _parts
        self._bins: np.ndarray | None = None  # per-bin counts of every value, once one was dropped
        self._known: dict[tuple[str, float], Quantile] = {}  # (statistic, q) -> its value, until more values come
        self._cumulative: np.ndarray | None = None  # the histogram's running counts, until more values come

    def add(self, values: np.ndarray) -> None:
        """Fold in ``values`` (any shape; non-negative and finite, float64)."""
        values = np.asarray(values, dtype=np.float64).ravel()
        if values.size == 0:
            return
        self.count += values.size
        self._known.clear()
        self._cumulative = None
        if self._bins is not None:
            self._bin(values)
        if values.size > self.capacity:  # (the ones dropped here are counted above, or below once binning starts)
            if self.histogram and self._bins is None:
                self._start_bins(values)
            values = np.partition(values, values.size - self.capacity)[-self.capacity :]
        self._parts.append(values.copy())  # (the caller's array stays the caller's; a partition's tail frees the rest)
        self._held += values.size
        # Compact past 1.25 capacities: a partition per quarter capacity added, not per sample.
        if self._held > self.capacity + self.capacity // 4:
            self._compact()

    @property
    def kept(self) -> np.ndarray:
        """The largest values seen (all of them while ``count <= capacity``), in no order."""
        self._compact()
        return self._parts[0] if self._parts else np.empty(0)

    @property
    def complete(self) -> bool:
        """Whether every value seen is kept."""
        return self.count <= self.capacity

    def count_above(self, limit: float) -> tuple[int, bool]:
        """How many values exceed ``limit``, and whether that is a lower bound
        (every kept value does, and others were dropped)."""
        kept = self.kept
        n = int(np.count_nonzero(kept > limit))
        return n, n == kept.size and not self.complete

    def largest(self, rank: int) -> float | None:
        """The value of 0-based ``rank`` from the top (0: the largest), or
        None where it was dropped."""
        kept = self.kept
        if not 0 <= rank < kept.size:
            return None
        return float(np.partition(kept, kept.size - 1 - rank)[kept.size - 1 - rank])

    def quantile(self, q: float) -> Quantile:
        """The ``q``-quantile (0 <= q <= 1), numpy's "linear" method: exact
        where its order statistics are kept; else bounded by the histogram
        (or, without one, by 0 and the smallest kept value)."""
        known = self._known.get(("quantile", q))
        if known is not None:
            return known
        n = self.count
        if n == 0:
            return Quantile(0.0)
        virtual = (n - 1) * q  # (numpy's virtual index for "linear", in its arithmetic)
        below = min(max(math.floor(virtual), 0), n - 1)
        above = min(below + 1, n - 1)
        gamma = virtual - below
        a, b = self._ascending(below), self._ascending(above)
        if a is not None and b is not None:
            diff = b - a
            found = Quantile(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
        else:
            found = self._bounds(below, above, gamma)
        self._known["quantile", q] = found
        return found

    def median(self) -> Quantile:
        """The median as ``np.median`` computes it (the mean of the two middle values for an even count)."""
        known = self._known.get(("median", 0.5))
        if known is not None:
            return known
        n = self.count
        if n == 0:
            return Quantile(0.0)
        a, b = self._ascending((n - 1) // 2), self._ascending(n // 2)
        if a is not None and b is not None:
            found = Quantile(a if n % 2 else (a + b) / 2)
        else:
            found = self._bounds((n - 1) // 2, n // 2, 0.5)
        self._known["median", 0.5] = found
        return found

    # -------------------------------------------------------------- internals

    def _ascending(self, index: int) -> float | None:
        """The value of 0-based ``index`` in ascending order of all values seen (None: dropped)."""
        return self.largest(self.count - 1 - index)

    def _bounds(self, below: int, above: int, weight: float) -> Quantile:
        """An interval holding ``(1 - weight) * a + weight * b``, ``a`` and
        ``b`` the values of ascending indices ``below`` and ``above``, where
        one was dropped: each lies in its histogram bin (without one, in
        [0, the smallest kept value]), or is known where kept."""
        a, b = self._interval(below), self._interval(above)
        low = (1 - weight) * a[0] + weight * b[0]
        high = (1 - weight) * a[1] + weight * b[1]
        return Quantile(high, False, low, high)

    def _interval(self, index: int) -> tuple[float, float]:
        """Bounds of the value of ascending ``index``: itself where kept."""
        known = self._ascending(index)
        if known is not None:
            return known, known
        if self._bins is None:
            kept = self.kept
            return 0.0, float(kept.min()) if kept.size else 0.0
        if self._cumulative is None:
            self._cumulative = np.cumsum(self._bins)
        where = int(np.searchsorted(self._cumulative, index + 1))  # (the bin holding it)
        return _bin_start(where), _bin_end(where)

    def _compact(self) -> None:
        """Merge the kept parts into one array of at most ``capacity`` values."""
        if len(self._parts) <= 1 and self._held <= self.capacity:
            return
        values = np.concatenate(self._parts) if len(self._parts) > 1 else self._parts[0]
        self._parts = []
        if values.size > self.capacity:
            if self.histogram and self._bins is None:
                self._start_bins(values)  # (every value seen is here: none was dropped yet)
            values = np.partition(values, values.size - self.capacity)[-self.capacity :].copy()
        self._parts = [values]
        self._held = values.size

    def _start_bins(self, everything: np.ndarray) -> None:
        """Start the histogram from ``everything``, with the kept values not in it."""
        self._bins = np.zeros(_BINS, np.int64)
        self._bin(everything)
        for part in self._parts:
            self._bin(part)

    def _bin(self, values: np.ndarray) -> None:
        bins = values.astype(np.float32).view(np.uint32) >> _BIN_SHIFT
        self._bins += np.bincount(bins, minlength=_BINS)[:_BINS]


def _bin_float(index: int) -> float:
    """The float32 whose bit pattern starts histogram bin ``index``."""
    return float(np.array([index << _BIN_SHIFT], np.uint32).view(np.float32)[0])


def _bin_start(index: int) -> float:
    """A lower bound of the float64 values binned in ``index``: they round
    to float32 before binning, so those within half a float32 ulp below
    the bin's first float32 land in it too."""
    if index == _BINS - 1:  # (+inf's bin: values past float32's largest)
        return float(np.finfo(np.float32).max)
    return _bin_float(index) * (1 - 2.0**-24)


def _bin_end(index: int) -> float:
    """An upper bound of the float64 values binned in ``index`` (the next bin's start: they round below it)."""
    return float(np.finfo(np.float64).max) if index >= _BINS - 2 else _bin_float(index + 1)
