"""The low-precision dtypes and the ONNX element-type helpers around them."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

FLOAT = TensorProto.FLOAT
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})


@dataclass(frozen=True)
class LowDtype:
    """A low-precision float type the converter can target."""

    key: str  # "fp16" / "bf16": the CLI spelling
    onnx_type: int  # TensorProto enum
    type_str: str  # as written in ONNX schemas, e.g. "tensor(float16)"
    numpy: np.dtype
    max: float  # largest finite value
    tiny: float  # smallest positive value that is not flushed to zero (subnormal)
    min_cast_opset: int  # first default-domain opset whose Cast admits the type

    @property
    def name(self) -> str:
        return {"fp16": "float16", "bf16": "bfloat16"}[self.key]


FP16 = LowDtype(
    key="fp16",
    onnx_type=TensorProto.FLOAT16,
    type_str="tensor(float16)",
    numpy=np.dtype(np.float16),
    max=float(np.finfo(np.float16).max),
    tiny=float(np.finfo(np.float16).smallest_subnormal),
    min_cast_opset=1,
)
BF16 = LowDtype(
    key="bf16",
    onnx_type=TensorProto.BFLOAT16,
    type_str="tensor(bfloat16)",
    numpy=np.dtype(ml_dtypes.bfloat16),
    max=float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
    tiny=float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal),
    min_cast_opset=13,
)
LOW_DTYPES = {d.key: d for d in (FP16, BF16)}


def low_dtype(key: str) -> LowDtype:
    """Look up 'fp16' / 'bf16' (also accepts 'float16' / 'bfloat16')."""
    aliases = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
    k = aliases.get(str(key).lower(), str(key).lower())
    if k not in LOW_DTYPES:
        raise ValueError(f"unsupported dtype {key!r}: use 'fp16' or 'bf16'")
    return LOW_DTYPES[k]


# 'tensor(float16)' -> TensorProto.FLOAT16, built from the enum so new types come for free.
TYPE_STR_TO_ELEM: dict[str, int] = {
    f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items() if value != TensorProto.UNDEFINED
}
