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
from .runner import Runnable, choose_provider, runnable, value_bytes
from .schema import model_opsets
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
) -> Calibration:
    """Run ``model`` in fp32 on every sample with all float tensors exposed
    (a model that is itself low precision runs as validation runs it: through
    its emulation twin where ``emulate`` and the provider call for one)."""
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
    ref = runnable(model, low_dtype_of(ctx, model.functions), chosen, emulate, exposed, base_dir, "reference")
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
            array = values[name]
            if array.size == 0:
                continue
            low, high = float(array.min()), float(array.max())
            if not (math.isfinite(low) and math.isfinite(high)):  # (a NaN or Inf: range of the finite values)
                finite = array[np.isfinite(array)]
                low, high = (float(finite.min()), float(finite.max())) if finite.size else (math.inf, -math.inf)
            r = ranges.setdefault(name, TensorRange())
            r.size = max(r.size, int(array.size))
            r.shape = tuple(array.shape)
            r.low = min(r.low, low)
            r.high = max(r.high, high)
        del values
        result.samples += 1
    return result
