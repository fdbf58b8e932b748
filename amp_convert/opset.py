"""Opset upgrade, only where a rewrite needs it.

The output keeps the input's IR version and opsets, except that Cast to
bfloat16 needs default-domain opset 13, and the user may ask for a newer
opset (``--target-opset 22``: many ops admit bfloat16 only from opset 22).
"""

from __future__ import annotations

import onnx
import onnx.version_converter

from .errors import AmpError
from .schema import model_opsets


def check_target_opset(model: onnx.ModelProto, target: int | None) -> None:
    """Refuse a requested default-domain opset below the model's: opsets are
    only ever upgraded (lowering one could change what an op computes)."""
    current = model_opsets(model).get("", 0)
    if target is not None and target < current:
        raise AmpError(
            f"--target-opset {target} is below the model's opset {current}: lowering an opset is not supported; "
            f"give {current} or higher, or leave --target-opset out"
        )


def upgrade_opset(model: onnx.ModelProto, target: int) -> tuple[onnx.ModelProto, str | None]:
    """Return ``model`` at default-domain opset ``target`` (never lower), and a
    note saying what changed (None if nothing did)."""
    current = model_opsets(model).get("", 0)
    if target <= current:
        return model, None
    ir_version = model.ir_version
    try:
        upgraded = onnx.version_converter.convert_version(model, target)
    except Exception as e:  # the converter raises plain RuntimeErrors with C++ messages
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AmpError(f"cannot upgrade the model from opset {current} to {target}: {first}") from None
    upgraded.ir_version = max(ir_version, _min_ir_for_opset(target))
    if model.functions and not upgraded.functions:  # (the version converter drops local functions)
        upgraded.functions.extend(model.functions)  # (each declares the opsets its body is read at)
        return upgraded, f"opset upgraded from {current} to {target} (local functions kept as they are, at their own opsets)"
    return upgraded, f"opset upgraded from {current} to {target}"


def _min_ir_for_opset(opset: int) -> int:
    """Oldest IR version that onnx pairs with a default-domain opset: that
    of the first onnx release to reach it (onnx.helper.VERSION_TABLE), so a
    runtime that reads the opset reads the IR (onnxruntime 1.31 reads IR 13
    and opset 26, not IR 14)."""
    for _release, ir, version, *_ in onnx.helper.VERSION_TABLE:
        if opset <= version:
            return ir
    return onnx.IR_VERSION
