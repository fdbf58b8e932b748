"""The rule zoo: one small graph, built with onnx.helper, for each rule the
converter follows (the lists, the schema, untouched integer and quantized
computation, custom domains, subgraphs, sources and Casts, shared and
out-of-range constants, partly low-precision inputs). Each passes the full
checker and runs in onnxruntime; its float inputs are uniform in [-1, 1).

tests/test_rule_graphs.py converts every one at O0-O3 in fp16 and bf16;
tests/test_rules.py asserts each rule's plan in detail on graphs of its own.

    python models/rule_graphs.py OUT_DIR     # writes the graphs as .onnx files
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def _value(name: str, shape, elem: int = F32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _weights(shape, seed: int, scale: float = 0.4) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _model(name: str, nodes, inputs, outputs, inits: dict, extra_opsets=()) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", OPSET), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="amp-convert rule zoo")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def lists() -> onnx.ModelProto:
    """White (MatMul), follow (Relu, Transpose) and black (Softmax) ops in one chain."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu"),
        helper.make_node("Transpose", ["r1"], ["t1"], name="transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["t1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Softmax", ["h2"], ["s"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["s", "w3"], ["y"], name="mm3"),
    ]
    inits = {"w1": _weights((8, 8), 1), "w2": _weights((2, 8), 2), "w3": _weights((8, 4), 3)}
    return _model("lists", nodes, [_value("x", [2, 8])], [_value("y", [8, 4])], inits)


def batchnorm() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu: keep_batchnorm_fp32 at O2, low at O3."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    inits = {
        "w": _weights((4, 2, 3, 3), 4),
        "scale": np.ones(4, np.float32),
        "bias": np.zeros(4, np.float32),
        "mean": _weights((4,), 5, 0.1),
        "var": np.full(4, 0.5, np.float32),
    }
    return _model("batchnorm", nodes, [_value("x", [1, 2, 6, 6])], [_value("y", [1, 4, 6, 6])], inits)


def schema() -> onnx.ModelProto:
    """Ops the schema keeps fp32: NonMaxSuppression (no fp16 type) and Resize's scales input."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Resize", ["c", "", "scales"], ["up"], name="resize", mode="nearest"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "top"], ["picked"], name="nms"),
    ]
    boxes = np.random.default_rng(6).uniform(0, 1, (1, 6, 4)).astype(np.float32)
    boxes[..., 2:] += boxes[..., :2]  # (x1, y1) beyond (x0, y0)
    inits = {
        "w": _weights((2, 2, 1, 1), 7),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "boxes": boxes,
        "top": np.array([3], np.int64),
    }
    inputs = [_value("x", [1, 2, 4, 4]), _value("scores", [1, 1, 6])]
    outputs = [_value("up", [1, 2, 8, 8]), _value("picked", [None, 3], I64)]
    return _model("schema", nodes, inputs, outputs, inits)


def integers() -> onnx.ModelProto:
    """An integer shape computation beside float work: left as it is."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "first"], ["rows"], name="rows", axis=0),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"], name="unsqueeze"),
        helper.make_node("Concat", ["rows1", "minus_one"], ["target"], name="target", axis=0),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Reshape", ["h", "target"], ["y"], name="reshape"),
    ]
    inits = {
        "w": _weights((8, 4), 8),
        "first": np.array(0, np.int64),
        "axis0": np.array([0], np.int64),
        "minus_one": np.array([-1], np.int64),
    }
    return _model("integers", nodes, [_value("x", [2, 8])], [_value("y", [2, 4])], inits)


def quantized() -> onnx.ModelProto:
    """A QDQ-quantized MatMul (DequantizeLinear weights): left as it is."""
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="dequant"),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    inits = {
        "w_q": np.random.default_rng(9).integers(-100, 100, (8, 4)).astype(np.int8),
        "w_scale": np.array(0.01, np.float32),
        "w_zero": np.array(0, np.int8),
    }
    return _model("quantized", nodes, [_value("x", [2, 8])], [_value("y", [2, 4])], inits)


def custom_domain() -> onnx.ModelProto:
    """A contrib op (com.microsoft FusedMatMul): fp32 unless a list names it."""
    nodes = [
        helper.make_node("FusedMatMul", ["x", "w1"], ["h"], name="fused", domain="com.microsoft", alpha=0.5),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm"),
    ]
    inits = {"w1": _weights((8, 8), 10), "w2": _weights((8, 4), 11)}
    return _model(
        "custom_domain", nodes, [_value("x", [2, 8])], [_value("y", [2, 4])], inits, extra_opsets=[("com.microsoft", 1)]
    )


def if_branches() -> onnx.ModelProto:
    """An If whose branches read a value of the main graph (one low, one black-listed)."""
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w2"], ["t"], name="then_mm")], "then", [], [_value("t", [2, 8])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Softmax", ["h"], ["e"], name="else_softmax", axis=-1)], "else", [], [_value("e", [2, 8])]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch),
    ]
    inits = {"w1": _weights((8, 8), 12), "w2": _weights((8, 8), 13), "zero": np.array(0, np.float32)}
    return _model("if_branches", nodes, [_value("x", [2, 8])], [_value("y", [2, 8])], inits)


def loop_body() -> onnx.ModelProto:
    """A Loop whose body multiplies its state by a weight of the main graph."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["state_in", "w"], ["product"], name="body_mm"),
            helper.make_node("Tanh", ["product"], ["state_out"], name="body_tanh"),
            helper.make_node("Identity", ["keep_going"], ["keep_going_out"], name="body_cond"),
        ],
        "body",
        [_value("i", [], I64), _value("keep_going", [], TensorProto.BOOL), _value("state_in", [2, 8])],
        [_value("keep_going_out", [], TensorProto.BOOL), _value("state_out", [2, 8])],
    )
    nodes = [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)]
    inits = {"w": _weights((8, 8), 14), "trips": np.array(3, np.int64)}
    return _model("loop_body", nodes, [_value("x", [2, 8])], [_value("y", [2, 8])], inits)


def scan_body() -> onnx.ModelProto:
    """A Scan over the rows of x that reads a weight of the main graph."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["row", "w"], ["product"], name="body_mm"),
            helper.make_node("Add", ["state_in", "product"], ["state_out"], name="body_add"),
        ],
        "body",
        [_value("state_in", [8]), _value("row", [8])],
        [_value("state_out", [8])],
    )
    nodes = [helper.make_node("Scan", ["start", "x"], ["y"], name="scan", body=body, num_scan_inputs=1)]
    inits = {"w": _weights((8, 8), 15), "start": np.zeros(8, np.float32)}
    return _model("scan_body", nodes, [_value("x", [3, 8])], [_value("y", [8])], inits)


def sources() -> onnx.ModelProto:
    """Constant, ConstantOfShape and Cast(to=float) that feed low nodes: rewritten in place."""
    offset = numpy_helper.from_array(np.full((1, 8), 0.25, np.float32), "offset_value")
    nodes = [
        helper.make_node("Constant", [], ["offset"], name="offset", value=offset),
        helper.make_node(
            "ConstantOfShape", ["shape"], ["ones"], name="ones", value=numpy_helper.from_array(np.ones(1, np.float32))
        ),
        helper.make_node("Cast", ["ids"], ["ids_float"], name="ids_float", to=F32),
        helper.make_node("Add", ["x", "offset"], ["shifted"], name="shift"),
        helper.make_node("Mul", ["shifted", "ones"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "ids_float"], ["mixed"], name="mix"),
        helper.make_node("MatMul", ["mixed", "w"], ["y"], name="mm"),
    ]
    inits = {"shape": np.array([2, 8], np.int64), "w": _weights((8, 4), 16)}
    inputs = [_value("x", [2, 8]), _value("ids", [2, 8], I64)]
    return _model("sources", nodes, inputs, [_value("y", [2, 4])], inits)


def shared_weight() -> onnx.ModelProto:
    """One initializer read by a low MatMul and by a black-listed Softmax."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Softmax", ["w"], ["sw"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["h", "sw"], ["y"], name="mm_softmax"),
    ]
    return _model("shared_weight", nodes, [_value("x", [2, 8])], [_value("y", [2, 8])], {"w": _weights((8, 8), 17)})


def partly_low() -> onnx.ModelProto:
    """A model with fp16 already in it: fp16 weights behind Casts, and a lossy
    fp32 -> fp16 -> fp32 round trip that is the model's own meaning."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="to_fp16", to=F16),
        helper.make_node("MatMul", ["x16", "w16"], ["h16"], name="mm_fp16"),
        helper.make_node("Cast", ["h16"], ["h"], name="to_fp32", to=F32),
        helper.make_node("Cast", ["h"], ["h_round"], name="round_down", to=F16),
        helper.make_node("Cast", ["h_round"], ["h_rounded"], name="round_up", to=F32),
        helper.make_node("MatMul", ["h_rounded", "w"], ["y"], name="mm"),
    ]
    inits = {"w16": _weights((8, 8), 18).astype(np.float16), "w": _weights((8, 4), 19)}
    return _model("partly_low", nodes, [_value("x", [2, 8])], [_value("y", [2, 4])], inits)


def out_of_range() -> onnx.ModelProto:
    """A constant beyond fp16's range (1e5) and an epsilon that flushes to zero (1e-9)."""
    nodes = [
        helper.make_node("Mul", ["x", "big"], ["scaled"], name="scale_up"),
        helper.make_node("Mul", ["scaled", "small"], ["back"], name="scale_down"),
        helper.make_node("Mul", ["x", "x"], ["square"], name="square"),
        helper.make_node("Add", ["square", "eps"], ["guarded"], name="add_eps"),
        helper.make_node("Sqrt", ["guarded"], ["root"], name="sqrt"),
        helper.make_node("Add", ["back", "root"], ["h"], name="sum"),
        helper.make_node("MatMul", ["h", "w"], ["y"], name="mm"),
    ]
    inits = {
        "big": np.array(1e5, np.float32),
        "small": np.array(1e-5, np.float32),
        "eps": np.array(1e-9, np.float32),
        "w": _weights((8, 4), 20),
    }
    return _model("out_of_range", nodes, [_value("x", [2, 8])], [_value("y", [2, 4])], inits)


RULE_GRAPHS: dict[str, Callable[[], onnx.ModelProto]] = {
    "lists": lists,
    "batchnorm": batchnorm,
    "schema": schema,
    "integers": integers,
    "quantized": quantized,
    "custom_domain": custom_domain,
    "if_branches": if_branches,
    "loop_body": loop_body,
    "scan_body": scan_body,
    "sources": sources,
    "shared_weight": shared_weight,
    "partly_low": partly_low,
    "out_of_range": out_of_range,
}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in RULE_GRAPHS.items():
        onnx.save(build(), str(out / f"{name}.onnx"))
        print(f"wrote {out / name}.onnx")


if __name__ == "__main__":
    main()
