"""Checking: the converted model must pass the full ONNX checker (strict
shape and type inference), or the tool says exactly why not. onnxruntime's
own ops are checked against onnxruntime's schemas (see
:func:`amp_convert.ortschema.register_with_onnx`)."""

from __future__ import annotations

import os

import onnx

from .errors import ConversionError
from .external import PROTOBUF_LIMIT, payload_bytes
from .ortschema import check_with_extras

CHECK_MODES = ("full", "basic", "none")


def check_converted(model: onnx.ModelProto, mode: str = "full") -> bool:
    """Run the ONNX checker on the converted model; ``mode`` is 'full'
    (with strict shape inference), 'basic' or 'none'. Returns False when the
    model is too large to check in memory (over 2 GB): the caller checks the
    written file with :func:`check_file`."""
    if mode == "none":
        return True
    if payload_bytes(model) > PROTOBUF_LIMIT:
        return False
    _run_checker(model, mode)
    return True


def check_file(path: str | os.PathLike, mode: str = "full") -> None:
    """The checker on a written model (external data resolved beside it).
    The full check is the basic check on the file plus strict shape and type
    inference on the graph without its tensor data: what onnx's own full
    check runs (``check_type`` included: each op's inputs must be of types
    its schema allows), which would read all the external data into memory."""
    if mode == "none":
        return
    _run_checker(checkable(os.fspath(path)), "basic")
    if mode == "full":
        try:
            graph_only = onnx.load(os.fspath(path), load_external_data=False)
            infer = onnx.shape_inference.infer_shapes
            check_with_extras(lambda: infer(graph_only, check_type=True, strict_mode=True), graph_only)
        except (onnx.shape_inference.InferenceError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConversionError(f"the converted model fails the ONNX checker: {first}") from e


def checkable(path: str) -> str | onnx.ModelProto:
    """``path`` for onnx's checker, which opens only paths that are UTF-8;
    another (a byte the file system allows) is read here, external data
    included (the checker would look for a data file beside the process,
    not the model)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return onnx.load(path)
    return path


def _run_checker(model: onnx.ModelProto | str, mode: str) -> None:
    try:
        check_with_extras(
            lambda: onnx.checker.check_model(model, full_check=mode == "full"),
            model if isinstance(model, onnx.ModelProto) else None,
        )
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"the converted model fails the ONNX checker: {first}") from e
