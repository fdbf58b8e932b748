"""Which default-domain opsets and IR versions the installed onnxruntime
loads, asked of a one-node model (onnxruntime is imported where asked)."""

from __future__ import annotations

import re
from functools import cache

import onnx
from onnx import TensorProto, helper


def min_ir_for_opset(opset: int) -> int:
    """Oldest IR version that onnx pairs with a default-domain opset: that
    of the first onnx release to reach it (onnx.helper.VERSION_TABLE), so a
    runtime that reads the opset reads the IR (onnxruntime 1.31 reads IR 13
    and opset 26, not IR 14)."""
    for _release, ir, version, *_ in onnx.helper.VERSION_TABLE:
        if opset <= version:
            return ir
    return onnx.IR_VERSION


def version_refusal(opset: int, ir_version: int) -> str | None:
    """Why onnxruntime loads no model at this default-domain opset and IR
    version (None: it loads one)."""
    import onnxruntime

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        found = re.search(r"Unsupported model IR version[^)]*|[^.]*support for domain ai\.onnx is till opset \d+", detail)
        return found.group(0).strip() if found else detail[:200]
    return None


@cache
def loads_opset(opset: int) -> bool:
    """Whether onnxruntime loads a model at this default-domain opset, at the
    oldest IR version onnx pairs with it (see :func:`version_refusal`)."""
    return version_refusal(opset, min_ir_for_opset(opset)) is None


def newest_loaded_opset(below: int) -> int:
    """The newest default-domain opset below ``below`` that onnxruntime loads (0: none)."""
    return next((opset for opset in range(below - 1, 0, -1) if loads_opset(opset)), 0)
