"""The mixed-scale warning: an output whose tolerance, judged at the scale
of its largest values, lets a part of much smaller values be off by much
of their own range (a detector's box coordinates beside its class scores)."""

from __future__ import annotations

import math

import numpy as np

from .tolerance import Tolerance

# Per axis of an output, a maximum per index is kept: for axes of at most
# this many indices, outputs of at most this many values.
AXIS_INDICES = 4096
AXIS_ELEMENTS = 1 << 24
# An index's largest value is a scale only over enough values (the other
# axes' and the samples'): over one or two (a decoder step's logits, one
# value per vocabulary index in each sample) it is the value itself, and a
# logit that happens to lie near 0 is no part of another scale.
AXIS_MIN_VALUES = 8


class AxisScales:
    """Along each axis of 2 to AXIS_INDICES indices of one output, per
    index: the largest |reference| and |error| over the rest of the output
    and the samples (``kept``: axis -> (scales, errors)). Kept while every
    sample has one shape, for outputs of at most AXIS_ELEMENTS values."""

    def __init__(self) -> None:
        self.kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.shape: tuple[int, ...] | None = None  # the shape they are kept for (() once shapes differ)
        self.samples = 0  # the samples folded into them

    def update(self, shape: tuple[int, ...], abs_r: np.ndarray, err: np.ndarray) -> None:
        """Fold in one sample's |reference| and |error| (flat, of ``shape``)."""
        if self.shape is None:
            self.shape = shape if abs_r.size <= AXIS_ELEMENTS else ()
        if shape != self.shape:
            self.shape, self.kept = (), {}
        if not self.shape:
            return
        self.samples += 1
        abs_r, err = abs_r.reshape(shape), err.reshape(shape)
        for axis, n in enumerate(shape):
            if not 2 <= n <= AXIS_INDICES:
                continue
            rest = tuple(k for k in range(len(shape)) if k != axis)
            found = (abs_r.max(axis=rest), err.max(axis=rest))
            kept = self.kept.setdefault(axis, found)
            if kept is not found:
                np.maximum(kept[0], found[0], out=kept[0])
                np.maximum(kept[1], found[1], out=kept[1])

    def warning(self, max_abs_ref: float, tol: Tolerance) -> str | None:
        """The tolerance is one per output, at the scale of its largest
        values (``max_abs_ref``): where an output packs values of very
        different scales, a part whose values are small next to the rest
        can be off by much of its own range and pass. Along the axis where
        it is worst, the part (indices) whose values stay within a tenth of
        the output's scale and are off by over a tenth of their own, past
        the tolerance at their own scale, described; None where there is
        none. Only along axes whose indices hold AXIS_MIN_VALUES values or
        more over the samples."""
        worst: tuple[float, int, np.ndarray] | None = None
        size = math.prod(self.shape or ())
        for axis, (scales, errors) in self.kept.items():
            if size // len(scales) * self.samples < AXIS_MIN_VALUES:
                continue
            off = (scales * 10 <= max_abs_ref) & (errors > 0.1 * scales) & (errors > tol.atol + tol.rtol * scales)
            if off.any():
                share = float((errors[off] / np.maximum(scales[off], 1e-30)).max())
                if worst is None or share > worst[0]:
                    worst = (share, axis, off)
        if worst is None:
            return None
        share, axis, off = worst
        scales, errors = self.kept[axis]
        where = np.flatnonzero(off)
        one = len(where) == 1
        at = f"index {where[0]}" if one else f"{len(where)} of its {len(off)} indices ({_index_ranges(where)})"
        reach, are, them, their = ("reaches", "is", "it", "its") if one else ("reach", "are", "them", "their")
        part = float(scales[off].max())
        how = f"{share:.0%} of {their} own range" if part > 0 else "where fp32 is 0"
        return (
            f"along axis {axis}, {at} {reach} at most {part:.3g} in fp32 (the output {max_abs_ref:.3g}, the scale "
            f"it is judged at) and {are} off by up to {float(errors[off].max()):.3g}, {how}: give a lower `rtol` to "
            f"judge {them} at {their} own scale, or validate {them} as an output of {their} own"
        )


def _index_ranges(indices: np.ndarray, most: int = 4) -> str:
    """Sorted indices as runs: "4-83", "0, 2, 5-7" (the first ``most`` runs)."""
    starts = [0, *(np.flatnonzero(np.diff(indices) != 1) + 1).tolist()]
    ends = [*starts[1:], len(indices)]
    runs = [f"{indices[a]}" if b - a == 1 else f"{indices[a]}-{indices[b - 1]}" for a, b in zip(starts, ends, strict=True)]
    return ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")
