"""A model's inputs as validation sees them, and the options that name
them: shapes (``NAME=1x3x224x224``) and value ranges (``NAME=LOW:HIGH``),
parsed and checked against the inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from .errors import AmpError


@dataclass(frozen=True)
class InputSpec:
    """A graph input as validation sees it."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]  # ints, symbolic names, or None (unknown)
    ranked: bool = True  # False: the model gives no shape at all (any rank goes; () is a scalar)


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs excluded)."""
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        if v.type.WhichOneof("value") != "tensor_type":
            raise AmpError(
                f"input {v.name!r} is not a tensor (a sequence, map or optional): validation cannot feed it; use `validate` false"
            )
        t = v.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        dims: list[int | str | None] = []
        if t.HasField("shape"):
            for d in t.shape.dim:
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(d.dim_value)
                else:
                    dims.append(d.dim_param or None)
        specs.append(InputSpec(v.name, dtype, tuple(dims), ranked=t.HasField("shape")))
    return specs


def is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == np.dtype(ml_dtypes.bfloat16)


def shape_text(shape: Sequence) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def parse_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` (or ``NAME=1,3,224,224``)."""
    out = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.replace(",", "x").split("x") if d != "") if dims else ()
            if any(d < 0 for d in shape):
                raise ValueError
        except ValueError:
            raise AmpError(f"`input_shape` {v!r}: expected NAME=1x3x224x224") from None
        out[name] = shape
    return out


def parse_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``NAME=LOW:HIGH``."""
    out = {}
    for v in values:
        name, sep, rng = v.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            low_s, high_s = rng.split(":")
            low, high = float(low_s), float(high_s)
            if not (low < high and math.isfinite(low) and math.isfinite(high)):
                raise ValueError
        except ValueError:
            raise AmpError(f"`input_range` {v!r}: expected NAME=LOW:HIGH with finite LOW < HIGH") from None
        out[name] = (low, high)
    return out


def check_given(specs: list[InputSpec], shape_map: dict[str, tuple[int, ...]], range_map: dict[str, tuple[float, float]]) -> None:
    """``input_shape`` and ``input_range`` name inputs of the model; a shape fits its input's."""
    names = {s.name for s in specs}
    for option, given in (("`input_shape`", shape_map), ("`input_range`", range_map)):
        for name in given:
            if name not in names:
                raise AmpError(f"{option}: {name!r} is not an input of the model (inputs: {', '.join(sorted(names))})")
    for spec in specs:
        if spec.name in shape_map:
            shape = shape_map[spec.name]
            if spec.ranked and len(shape) != len(spec.shape):
                raise AmpError(f"`input_shape` {spec.name}: rank {len(shape)}, the model expects {shape_text(spec.shape)}")
            for got, want in zip(shape, spec.shape, strict=False):
                if isinstance(want, int) and got != want:
                    raise AmpError(f"`input_shape` {spec.name}: {list(shape)} does not fit {shape_text(spec.shape)}")
