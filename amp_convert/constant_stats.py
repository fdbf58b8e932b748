"""What the model's float constants hold, gathered once and in bulk: the
largest magnitude, the non-finite values and how many non-zero values a
low dtype flushes to zero (ValueStats, ConstantFacts), and the tensors of
initializers and Constant nodes behind a name. The safety rule and the
rewrite both read these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from .dtypes import LowDtype
from .errors import AmpError
from .external import read_array

# Half the smallest subnormal rounds to zero.
_FP16_ZERO = 2.0**-25
_BF16_ZERO = 2.0**-134
# Underflow matters for small constants (epsilons, scales) or when most of
# the non-zero values of a tensor would vanish; a few tiny weights do not.
SMALL_CONSTANT = 16


class ValueStats(NamedTuple):
    """What the converter needs to know about a constant's values (a tuple:
    graphs with a hundred thousand weights make one each)."""

    size: int
    abs_max: float
    nonzero: int
    underflow_fp16: int  # non-zero values that round to zero in fp16
    underflow_bf16: int
    nonfinite: int

    def underflow(self, low: LowDtype) -> int:
        return self.underflow_fp16 if low.key == "fp16" else self.underflow_bf16


def value_stats(array: np.ndarray) -> ValueStats:
    a = np.abs(array.astype(np.float32, copy=False).ravel())
    nonfinite = 0
    if a.size and not np.isfinite(a.max()):
        finite = np.isfinite(a)
        nonfinite = int(a.size - np.count_nonzero(finite))
        a = a[finite]
    if a.size == 0:
        return ValueStats(int(array.size), 0.0, 0, 0, 0, nonfinite)
    if a.min() > _FP16_ZERO:  # common case: nothing near zero, nothing to flush
        return ValueStats(int(array.size), float(a.max()), int(a.size), 0, 0, nonfinite)
    nonzero = a > 0
    return ValueStats(
        size=int(array.size),
        abs_max=float(a.max()),
        nonzero=int(np.count_nonzero(nonzero)),
        underflow_fp16=int(np.count_nonzero(nonzero & (a <= np.float32(_FP16_ZERO)))),
        underflow_bf16=int(np.count_nonzero(nonzero & (a <= np.float32(_BF16_ZERO)))),
        nonfinite=nonfinite,
    )


def segment_counts(marks: np.ndarray, starts: np.ndarray) -> dict[int, int]:
    """Segment -> how many of ``marks`` (a bool array cut into segments
    beginning at ``starts``) are set in it, for the segments with any: few
    are, so the set ones are located rather than every segment summed."""
    where = np.flatnonzero(marks)
    if not where.size:
        return {}
    counts = np.bincount(np.searchsorted(starts, where, side="right") - 1, minlength=len(starts))
    hit = np.flatnonzero(counts)
    return dict(zip(hit.tolist(), counts[hit].tolist(), strict=True))


def constant_array(tensor: onnx.TensorProto, base_dir: Path | None = None) -> np.ndarray:
    """Values of a float tensor; raw float32 data is read without a copy,
    external data from its file (``base_dir``: the model's folder)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if base_dir is None:
            raise ValueError(f"tensor {tensor.name!r} has external data but the model's folder is unknown")
        return read_array(tensor, base_dir)
    if tensor.data_type == onnx.TensorProto.FLOAT and tensor.raw_data:
        return raw_float32(tensor)
    return numpy_helper.to_array(tensor)


def small_raw(tensor: onnx.TensorProto, most: int = 1 << 16) -> bytes:
    """The raw bytes of an inline tensor of up to ``most`` float32 values
    (whole ones), else b"": what the one-buffer passes over small weights
    (statistics, lowering) take; the rest go tensor by tensor."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return b""
    data = tensor.raw_data
    return data if 0 < len(data) <= 4 * most and not len(data) % 4 else b""


def raw_float32(tensor: onnx.TensorProto) -> np.ndarray:
    """A float32 tensor's raw data as an array (no copy). Raw data cut in
    the middle of a value passes the ONNX checker when it is not too short:
    refused here, as a bad input, where the values are first needed."""
    data = tensor.raw_data
    if len(data) % 4:
        raise AmpError(
            f"tensor {tensor.name!r} has {len(data)} bytes of float32 raw data, not a whole number of values (a corrupt model)"
        )
    return np.frombuffer(data, dtype="<f4")


@dataclass(eq=False)
class ConstantFacts:
    """What one vectorised pass over many small raw float32 constants finds,
    a row per constant: their statistics, and their values already in the
    low dtype for the rewrite. Worked out by :func:`constant_facts`."""

    low: str  # the key of the low dtype of ``low_data``
    names: list[str]
    size: list[int]
    abs_max: list[float]
    finite: list[bool]
    nonzero: list[int]
    underflow_fp16: dict[int, int]  # row -> non-zero values that round to zero (rows with none are left out)
    underflow_bf16: dict[int, int]
    flushed: dict[int, int]  # row -> non-zero values that are zero in ``low_data``
    low_data: bytes  # every row's values in the low dtype, one row after the other
    ends: list[int]  # where each row's values end in ``low_data``

    def stats(self, row: int) -> ValueStats:
        return ValueStats(
            self.size[row],
            self.abs_max[row],
            self.nonzero[row],
            self.underflow_fp16.get(row, 0),
            self.underflow_bf16.get(row, 0),
            0,
        )

    def remarkable(self, low: LowDtype) -> set[str]:
        """Names of the rows ``low`` does not hold as they are: not finite,
        out of range, or with values flushed (few, usually none)."""
        high = low.max
        rows = {k for k, (ok, top) in enumerate(zip(self.finite, self.abs_max, strict=True)) if not ok or top > high}
        rows.update(self.underflow_fp16 if low.key == "fp16" else self.underflow_bf16)
        return {self.names[k] for k in rows}


def constant_facts(names: list[str], blobs: list[bytes], low: LowDtype) -> ConstantFacts:
    """:class:`ConstantFacts` of the constants ``names`` whose raw float32
    bytes are ``blobs`` (whole values, at least one), in one array: an
    array per tensor costs more than its values, for small ones."""
    sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)) // 4
    ends = np.cumsum(sizes)
    starts = ends - sizes
    values = np.frombuffer(b"".join(blobs), dtype="<f4")
    with np.errstate(over="ignore"):  # (a value beyond the range is not taken from here: see low_values)
        lowered = values.astype(low.numpy)
    magnitude = np.abs(values)
    highs = np.maximum.reduceat(magnitude, starts)
    nonzero = magnitude > 0
    # (summed as bytes into 32-bit counts: a bool array summed as int64 is first copied whole as int64)
    n_nonzero = np.add.reduceat(nonzero.view(np.uint8), starts, dtype=np.uint32)
    tiny = nonzero & (magnitude <= np.float32(_FP16_ZERO))  # (few or none: counted where they are)
    under_fp16 = segment_counts(tiny, starts)
    under_bf16 = segment_counts(tiny & (magnitude <= np.float32(_BF16_ZERO)), starts) if under_fp16 else {}
    return ConstantFacts(
        low=low.key,
        names=names,
        size=sizes.tolist(),
        abs_max=highs.tolist(),
        finite=np.isfinite(highs).tolist(),
        nonzero=n_nonzero.tolist(),
        underflow_fp16=under_fp16,
        underflow_bf16=under_bf16,
        flushed=segment_counts(nonzero & (lowered == 0), starts),
        low_data=lowered.tobytes(),
        ends=(ends * lowered.itemsize).tolist(),
    )


def chunked_facts(
    tensors: dict[str, onnx.TensorProto], low: LowDtype, most: int = 1 << 16, chunk: int = 1 << 22
) -> list[ConstantFacts]:
    """:func:`constant_facts` of the raw float32 tensors of up to ``most``
    elements among ``tensors`` (others are left to
    :meth:`ConstantRanges.stats`), in passes over up to ``chunk`` elements."""
    facts, names, blobs, size, chunk_bytes = [], [], [], 0, chunk * 4
    for name, t in tensors.items():
        if t.data_type == onnx.TensorProto.FLOAT:
            data = small_raw(t, most)
            if data:
                names.append(name)
                blobs.append(data)
                size += len(data)
                if size >= chunk_bytes:
                    facts.append(constant_facts(names, blobs, low))
                    names, blobs, size = [], [], 0
    if blobs:
        facts.append(constant_facts(names, blobs, low))
    return facts


def graph_constant_facts(
    initializers: dict[str, onnx.TensorProto], nodes: Sequence[onnx.NodeProto], ops: Sequence[str], low: LowDtype
) -> list[ConstantFacts]:
    """The facts on a graph's small float32 constants: its initializers,
    then its Constant values (``ops``: the nodes' op types)."""
    return chunked_facts(initializers, low) + chunked_facts(constant_values(nodes, ops), low)


def constant_values(nodes: Sequence[onnx.NodeProto], ops: Sequence[str]) -> dict[str, onnx.TensorProto]:
    """The tensors Constant nodes (``ops``: the nodes' op types) hold in a
    ``value`` attribute, by output name (gathered with the initializers: see
    :func:`graph_constant_facts`; other Constant forms are judged one by
    one)."""
    values = {}
    for i in [i for i, op in enumerate(ops) if op == "Constant"]:
        node = nodes[i]
        if node.output:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    values[node.output[0]] = a.t
    return values


def attribute_constant(node: onnx.NodeProto, name: str) -> tuple[str, onnx.TensorProto] | None:
    """The values a Constant or ConstantOfShape node writes, as a tensor."""
    for a in node.attribute:
        if a.name == "value":
            return name, a.t
        if a.name == "value_float":
            return name, numpy_helper.from_array(np.array(a.f, np.float32), name)
        if a.name == "value_floats":
            return name, numpy_helper.from_array(np.array(list(a.floats), np.float32), name)
    return None
