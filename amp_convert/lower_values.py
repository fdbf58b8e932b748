"""fp32 constant values converted to the low dtype, in place: out-of-range
values clipped and counted, tiny ones flushed to zero and counted (never
silently), and what the rewrite did, for the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .constant_stats import ValueStats, raw_float32, segment_counts, value_stats
from .dtypes import LowDtype
from .external import read_array, retype_external


@dataclass
class RewriteStats:
    """What the rewrite did, for the report."""

    casts_inserted: int = 0
    initializers_lowered: int = 0
    initializers_shared: int = 0  # kept fp32 because fp32 and low readers share them
    constants_lowered: int = 0
    attributes_rewritten: int = 0
    outputs_renamed: list[str] = field(default_factory=list)
    clipped: dict[str, int] = field(default_factory=dict)  # constant -> values clipped to +-max
    flushed: dict[str, int] = field(default_factory=dict)  # constant -> non-zero values that became 0

    def as_dict(self) -> dict:
        return {
            "casts_inserted": self.casts_inserted,
            "initializers_lowered": self.initializers_lowered,
            "initializers_shared": self.initializers_shared,
            "constants_lowered": self.constants_lowered,
            "attributes_rewritten": self.attributes_rewritten,
            "outputs_renamed": self.outputs_renamed,
            "values_clipped": sum(self.clipped.values()),
            "values_flushed_to_zero": sum(self.flushed.values()),
            "clipped": self.clipped,
            "flushed": self.flushed,
        }


def to_low_array(array: np.ndarray, low: LowDtype, name: str, stats: RewriteStats) -> np.ndarray:
    """Convert float32 values to ``low``, clipping out-of-range values and
    counting both clipped and flushed values."""
    a = np.asarray(array, dtype=np.float32)
    if a.size == 0:
        return a.astype(low.numpy)
    magnitude = np.abs(a)
    not_nan = ~np.isnan(magnitude)  # NaN stays NaN; it must not hide the other values from the checks
    if np.max(magnitude, initial=0.0, where=not_nan) > low.max:
        over = np.isfinite(a) & (magnitude > low.max)
        n_over = int(np.count_nonzero(over))
        if n_over:
            a = np.where(over, np.sign(a) * np.float32(low.max), a)
            stats.clipped[name] = stats.clipped.get(name, 0) + n_over
    out = a.astype(low.numpy)
    if np.min(magnitude, initial=np.inf, where=not_nan) < low.tiny:  # only then can a value flush to zero
        candidates = (magnitude < low.tiny) & (a != 0)  # (few: look at their converted values only)
        n_flushed = int(np.count_nonzero(out.reshape(-1)[candidates.reshape(-1)] == 0))
        if n_flushed:
            stats.flushed[name] = stats.flushed.get(name, 0) + n_flushed
    return out


def lower_tensor(
    tensor: onnx.TensorProto,
    low: LowDtype,
    stats: RewriteStats,
    label: str = "",
    base_dir: Path | None = None,
    values: ValueStats | None = None,
) -> None:
    """Rewrite a float32 TensorProto in place as ``low`` (same name). An
    external tensor with nothing to clip is only retyped: its values are
    converted as the model is written (``values``: its statistics, when
    known; they count what flushes to zero). One with values to clip is
    read, clipped and stored inline at half the size."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if base_dir is None:
            raise ValueError(f"tensor {tensor.name!r} has external data but the model's folder is unknown")
        known = values or value_stats(read_array(tensor, base_dir))
        if known.abs_max <= low.max:
            if known.underflow(low):
                name = label or tensor.name
                stats.flushed[name] = stats.flushed.get(name, 0) + known.underflow(low)
            retype_external(tensor, low.onnx_type)
            return
        converted = to_low_array(read_array(tensor, base_dir), low, label or tensor.name, stats)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = converted.tobytes()
        tensor.data_type = low.onnx_type
        return
    if tensor.raw_data:
        # Fast path: raw little-endian float32 in, raw low-precision bytes out.
        tensor.raw_data = to_low_array(raw_float32(tensor), low, label or tensor.name, stats).tobytes()
        tensor.data_type = low.onnx_type
        return
    converted = to_low_array(numpy_helper.to_array(tensor), low, label or tensor.name, stats)
    new = numpy_helper.from_array(converted, tensor.name)
    new.doc_string = tensor.doc_string
    tensor.CopyFrom(new)


def lower_small_tensors(
    tensors: list[onnx.TensorProto],
    low: LowDtype,
    stats: RewriteStats,
    labels: list[str] | None = None,
    blobs: list[bytes] | None = None,
) -> None:
    """:func:`lower_tensor` for many small raw float32 tensors in one numpy
    pass: graphs with tens of thousands of small weights would otherwise pay
    numpy's per-call overhead for each. Values out of range (rare) send the
    batch through the tensor-by-tensor path, which clips and counts them.
    ``labels``: the names counts are reported under (default: the tensors');
    ``blobs``: their raw bytes, when the caller has read them."""
    if not tensors:
        return
    labels = labels or [t.name for t in tensors]
    blobs = blobs or [t.raw_data for t in tensors]
    flat = np.frombuffer(b"".join(blobs), dtype="<f4")  # (one array: one per small tensor costs more than its values)
    if not np.maximum(flat.max(), -flat.min()) <= low.max:  # (also true for NaN; no array of absolute values)
        for t, label in zip(tensors, labels, strict=True):
            lower_tensor(t, low, stats, label)
        return
    out = flat.astype(low.numpy)
    sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)) // 4
    ends = np.cumsum(sizes)
    for k, n in segment_counts((flat != 0) & (out == 0), ends - sizes).items():
        stats.flushed[labels[k]] = stats.flushed.get(labels[k], 0) + n
    data = out.tobytes()
    width = out.itemsize
    start = 0
    for t, end in zip(tensors, ends.tolist(), strict=True):
        t.raw_data = data[start * width : end * width]
        t.data_type = low.onnx_type
        start = end
