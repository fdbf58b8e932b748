"""Checking: the converted model must pass the full ONNX checker (strict
shape and type inference), or the tool says exactly why not."""

from __future__ import annotations

import onnx

from .errors import ConversionError

CHECK_MODES = ("full", "basic", "none")


def check_converted(model: onnx.ModelProto, mode: str = "full") -> None:
    """Run the ONNX checker on the converted model; ``mode`` is 'full'
    (with strict shape inference), 'basic' or 'none'."""
    if mode == "none":
        return
    try:
        onnx.checker.check_model(model, full_check=mode == "full")
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"the converted model fails the ONNX checker: {first}") from e
