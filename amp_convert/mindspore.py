"""The seed's names (MindSpore ``amp``) on ONNX models."""

from __future__ import annotations

import os
from collections.abc import Iterable

import onnx

from .op_profiles import builtin_lists
from .options import ConvertOptions
from .pipeline import convert

ModelLike = onnx.ModelProto | str | os.PathLike


def _check_model_type(model: object) -> None:
    if not isinstance(model, (onnx.ModelProto, str, os.PathLike)):
        raise TypeError(f"The model should be an onnx.ModelProto or a path, but got {type(model).__name__}.")


def auto_mixed_precision(model: ModelLike, amp_level: str = "O0", dtype: str = "fp16") -> onnx.ModelProto:
    """Return ``model`` converted at ``amp_level`` (O0-O3) to ``dtype``.

    Raises TypeError for a non-model and ValueError for an unknown level or dtype.
    """
    _check_model_type(model)
    if not isinstance(amp_level, str) or amp_level.upper() not in ("O0", "O1", "O2", "O3"):
        raise ValueError(f"The amp level {amp_level} is not supported")
    return convert(model, ConvertOptions(level=amp_level, dtype=dtype)).model


def custom_mixed_precision(
    model: ModelLike,
    *,
    white_list: Iterable[str] | None = None,
    black_list: Iterable[str] | None = None,
    dtype: str = "fp16",
) -> onnx.ModelProto:
    """Return ``model`` converted to ``dtype`` with a custom white list (only
    those ops run low, as O1) or a custom black list (all but those run low,
    as O2); exactly one of the two.

    Raises TypeError for a non-model or a list that is not a list of op
    names, and ValueError where both lists or neither are given."""
    _check_model_type(model)
    if white_list is None and black_list is None:
        raise ValueError("For custom_mixed_precision, one of white_list and black_list must be provided.")
    if white_list is not None and black_list is not None:
        raise ValueError(
            "For custom_mixed_precision, the white_list or black_list cannot be provided at the same time, "
            "please provide one or the other."
        )
    given = white_list if white_list is not None else black_list
    name = "white_list" if white_list is not None else "black_list"
    if isinstance(given, str) or not isinstance(given, (list, tuple, set, frozenset)):
        raise TypeError(f"The type of {name} should be list, but got {type(given).__name__}")
    for op in given:
        if not isinstance(op, str):
            raise TypeError(f"The element in {name} should be an ONNX op type (str), but got {op!r}")
    if white_list is not None:
        options = ConvertOptions(only_white_list=tuple(white_list), dtype=dtype)
    else:
        options = ConvertOptions(only_black_list=tuple(black_list), dtype=dtype)
    return convert(model, options).model


def get_white_list(profile: str = "default") -> list[str]:
    """A copy of the built-in white list (ONNX op types, and onnxruntime's
    fused ops as ``com.microsoft::Attention``)."""
    return sorted(builtin_lists(profile, "O1", "fp16")[0])


def get_black_list(profile: str = "default") -> list[str]:
    """A copy of the built-in black list (ONNX op types, and onnxruntime's
    fused ops as ``com.microsoft::BiasSoftmax``)."""
    return sorted(builtin_lists(profile, "O1", "fp16")[1])
