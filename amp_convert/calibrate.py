"""Calibration: value ranges of every float tensor in the fp32 model, from
one streaming pass over reference samples.

Only a min and a max per tensor (and its element count, for compute
estimates) are kept, never the tensors themselves.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from .emulate import low_dtype_of
from .graph import build_context
from .runner import Runnable, choose_provider, input_dtypes, runnable, value_bytes
from .schema import model_opsets
from .segments import PART_BYTES, PartModel, node_order, run_in_parts, typed_throughout, worth_splitting
from .typeinfo import infer_types


@dataclass
class TensorRange:
    low: float = float("inf")
    high: float = float("-inf")
    size: int = 0  # elements in one sample (the largest seen)
    shape: tuple[int, ...] = ()

    @property
    def abs_max(self) -> float:
        return max(abs(self.low), abs(self.high))


@dataclass
class Calibration:
    """Per-tensor ranges of the fp32 model (main graph) over the samples."""

    ranges: dict[str, TensorRange] = field(default_factory=dict)
    samples: int = 0
    provider: str = "cpu"
    # (feeds, graph outputs) per sample, kept when small so validation of the
    # same samples need not run the fp32 model again; None when too large.
    outputs: list[tuple[dict, dict]] | None = None
    source: object = field(default=None, repr=False)  # the samples these outputs are of (compared by identity)
    # The session that ran, every float tensor exposed: validation reuses it
    # for the reference (a session of a large graph takes seconds to start).
    session: Runnable | None = field(default=None, repr=False)
    exposed: frozenset[str] = frozenset()

    def abs_max(self, name: str) -> float | None:
        r = self.ranges.get(name)
        return None if r is None or r.size == 0 else r.abs_max


def calibrate(
    model: onnx.ModelProto,
    samples: Iterable[dict[str, np.ndarray]],
    provider: str = "auto",
    keep_bytes: int = 64 << 20,
    base_dir: str | os.PathLike | None = None,
    emulate: str = "auto",
    part_bytes: int = PART_BYTES,
) -> Calibration:
    """Run ``model`` in fp32 on every sample with all float tensors exposed
    (a model that is itself low precision runs as validation runs it: through
    its emulation twin where ``emulate`` and the provider call for one). An
    fp32 model whose weights pass ``part_bytes`` runs in parts, each within
    it (:mod:`amp_convert.segments`)."""
    ctx = build_context(model.graph)
    infer_types(ctx, model_opsets(model))
    names = [
        name
        for node in ctx.nodes
        for name in node.output
        if name and ctx.types.get(name) in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    ]
    names += [n for n in ctx.input_names if ctx.types.get(n) == TensorProto.FLOAT and n not in ctx.initializers]
    chosen, _ = choose_provider(provider)
    exposed = [(n, ctx.types[n]) for n in names if n not in ctx.input_set]
    low = low_dtype_of(ctx, model.functions)
    if low is None and worth_splitting(model, part_bytes) and typed_throughout(model, ctx.types):
        return _calibrate_in_parts(model, ctx, names, list(samples), samples, chosen, base_dir, keep_bytes, part_bytes)
    ref = runnable(model, low, chosen, emulate, exposed, base_dir, "reference")
    returned = frozenset(n for n, _ in exposed).union(v.name for v in model.graph.output)
    result = Calibration(provider=chosen, outputs=[], source=samples, session=ref, exposed=returned)
    ranges = result.ranges
    output_names = [v.name for v in model.graph.output]
    kept_bytes = 0
    for feeds in samples:
        values = ref.run(feeds)
        if result.outputs is not None:
            outputs = {n: values[n] for n in output_names}
            kept_bytes += sum(map(value_bytes, (*outputs.values(), *feeds.values())))
            result.outputs = [*result.outputs, (feeds, outputs)] if kept_bytes <= keep_bytes else None
        values.update({k: v for k, v in feeds.items() if k in ctx.input_set})
        for name in names:
            _widen(ranges, name, values[name])
        del values
        result.samples += 1
    return result


def _widen(ranges: dict[str, TensorRange], name: str, array: np.ndarray) -> None:
    """Take one sample's ``array`` of tensor ``name`` into its range."""
    if array.size == 0:
        return
    low, high = float(array.min()), float(array.max())
    if not (math.isfinite(low) and math.isfinite(high)):  # (a NaN or Inf: range of the finite values)
        finite = array[np.isfinite(array)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (math.inf, -math.inf)
    r = ranges.setdefault(name, TensorRange())
    r.size = max(r.size, int(array.size))
    r.shape = tuple(array.shape)
    r.low = min(r.low, low)
    r.high = max(r.high, high)


def _calibrate_in_parts(model, ctx, names, samples, source, provider, base_dir, keep_bytes, part_bytes) -> Calibration:
    """:func:`calibrate` of an fp32 model whose weights pass ``part_bytes``,
    run in parts (:mod:`amp_convert.segments`): memory holds one part's
    weights and tensors, not the whole model's. No session is lent to
    validation (it runs in parts too); the outputs are kept when small."""
    result = Calibration(provider=provider, outputs=None, source=source)
    output_names = [v.name for v in model.graph.output]
    kept: list[dict] = [{} for _ in samples]
    wanted = set(names)

    def consume(i: int, values: list[dict]) -> None:
        for name, array in values[0].items():
            if name in wanted:
                _widen(result.ranges, name, array)
            if name in output_names:
                kept[i][name] = np.array(array)  # (copied: a returned array can hold its part's whole arena alive)

    for name in names:
        for feeds in samples if name in ctx.input_set else ():
            _widen(result.ranges, name, feeds[name])
    parts = PartModel(model, ctx.types, provider, base_dir, "reference", (), input_dtypes(model))
    order, reach = node_order(model)
    inside = [n for n in names if n not in ctx.input_set]
    run_in_parts([parts], [*inside, *output_names], samples, consume, order=order, reach=reach, part_bytes=part_bytes)
    size = sum(value_bytes(v) for feeds, values in zip(samples, kept, strict=True) for v in (*feeds.values(), *values.values()))
    result.outputs = list(zip(samples, kept, strict=True)) if size <= keep_bytes else None
    result.samples = len(samples)
    return result
