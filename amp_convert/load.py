"""Loading: read an ONNX file and refuse, with one clear line, anything that
is not a model the converter can work on."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.defs
from google.protobuf.message import DecodeError

from .errors import AmpError
from .schema import model_opsets

MIN_IR_VERSION = 3
MIN_OPSET = 7


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and vet ``path``; raises AmpError with what is wrong."""
    p = Path(path)
    if not p.exists():
        raise AmpError(f"{p}: no such file")
    if p.is_dir():
        raise AmpError(f"{p}: is a directory, not an .onnx file")
    if p.stat().st_size == 0:
        raise AmpError(f"{p}: empty file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        raise AmpError(f"{p}: not a readable ONNX model ({_first_line(e)})") from None
    if model.ir_version == 0 or not model.HasField("graph"):
        raise AmpError(f"{p}: not an ONNX model (no IR version or no graph)")
    _check_external_data(model, p.parent.resolve(), p)
    if any(_external_tensors(model)):
        onnx.load_external_data_for_model(model, str(p.parent))
    check_versions(model, str(p))
    check_input_model(model, str(p))
    return model


def check_versions(model: onnx.ModelProto, label: str) -> None:
    if not MIN_IR_VERSION <= model.ir_version <= onnx.IR_VERSION:
        raise AmpError(
            f"{label}: IR version {model.ir_version} is not supported "
            f"(this converter reads {MIN_IR_VERSION} to {onnx.IR_VERSION})"
        )
    opset = model_opsets(model).get("")
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        raise AmpError(f"{label}: the model imports no default-domain (ai.onnx) opset")
    if not MIN_OPSET <= opset <= newest:
        raise AmpError(f"{label}: opset {opset} is not supported (this converter handles {MIN_OPSET} to {newest})")


def check_input_model(model: onnx.ModelProto, label: str) -> None:
    """The input must pass the ONNX checker: converting a broken model would
    only move the breakage."""
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise AmpError(f"{label}: the input model fails the ONNX checker: {_first_line(e)}") from None


def _external_tensors(model: onnx.ModelProto):
    from onnx.external_data_helper import _get_all_tensors

    for t in _get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


def _check_external_data(model: onnx.ModelProto, base: Path, label: Path) -> None:
    """External data must stay inside the model's folder and be long enough."""
    for tensor in _external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise AmpError(f"{label}: tensor {tensor.name!r} has external data without a location")
        target = (base / location).resolve()
        if Path(location).is_absolute() or not target.is_relative_to(base):
            raise AmpError(f"{label}: tensor {tensor.name!r} points outside the model's folder ({location!r}); refused")
        if not target.is_file():
            raise AmpError(f"{label}: external data file {location!r} of tensor {tensor.name!r} is missing")
        offset = int(info.get("offset", 0) or 0)
        length = info.get("length")
        size = target.stat().st_size
        if length is not None and offset + int(length) > size:
            raise AmpError(
                f"{label}: external data file {location!r} is too short for tensor {tensor.name!r} "
                f"(needs {offset + int(length)} bytes, has {size})"
            )


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
