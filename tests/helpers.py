"""Small-graph builders and runners shared by the tests (real onnx, real onnxruntime)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from amp_convert.cleanup import EXACT_WIDENINGS
from models.zoo_inputs import iter_nodes

F32, F16, BF16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT64

ort.set_default_logger_severity(3)


def value(name: str, elem: int = F32, shape: Sequence | None = (2, 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    opset: int = 17,
    extra_opsets: Sequence[tuple[str, int]] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def pads_model(modes: Sequence[str | None], opset: int, constant_node: bool = False, identity: bool = False) -> onnx.ModelProto:
    """x (1x4) -> MatMul -> one Pad per mode of ``modes`` (None: no mode
    attribute), each padding by 1 either side with constant_value ``cv``
    (1e10, beyond fp16's range; with ``constant_node`` made by a Constant
    node ``cvc``, not an initializer; with ``identity`` read through an
    Identity ``idn`` as ``cvi``) -> Mul by 0.5 -> output ``y<k>`` (1x6)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm")]
    cv = numpy_helper.from_array(np.array(1e10, np.float32), "cv")
    if constant_node:
        nodes.append(helper.make_node("Constant", [], ["cv"], name="cvc", value=cv))
    if identity:
        nodes.append(helper.make_node("Identity", ["cv"], ["cvi"], name="idn"))
    for k, mode in enumerate(modes):
        more = {} if mode is None else {"mode": mode}
        nodes.append(helper.make_node("Pad", ["h", "pads", "cvi" if identity else "cv"], [f"p{k}"], name=f"pad{k}", **more))
        nodes.append(helper.make_node("Mul", [f"p{k}", "half"], [f"y{k}"], name=f"mul{k}"))
    weight = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    inits = [init("W", weight), init("pads", np.array([0, 1, 0, 1])), *([] if constant_node else [cv])]
    inits.append(init("half", np.array(0.5, np.float32)))
    outputs = [value(f"y{k}", shape=(1, 6)) for k in range(len(modes))]
    return model(nodes, [value("x", shape=(1, 4))], outputs, inits, opset=opset)


def shape_readers_model() -> onnx.ModelProto:
    """MatMul -> Transpose (low at every level), read by Shape and Size
    (``shp``, ``size``: only for its shape) and by a Reshape."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Transpose", ["m"], ["t"], name="tr", perm=[1, 0]),
        helper.make_node("Shape", ["t"], ["s"], name="shp"),
        helper.make_node("Size", ["t"], ["n"], name="size"),
        helper.make_node("Reshape", ["t", "s"], ["y"], name="rs"),
    ]
    weight = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    outputs = [value("y", shape=(4, 4)), value("n", I64, shape=())]
    return model(nodes, [value("x", shape=(4, 4))], outputs, [init("W", weight)])


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def nodes_of(m: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op_type]


def elem_types(m: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of the main graph, from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    g = inferred.graph
    out = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    out.update({t.name: t.data_type for t in g.initializer})
    return out


def init_type(m: onnx.ModelProto, name: str) -> int:
    return next(t.data_type for t in m.graph.initializer if t.name == name)


def casts_into(m: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    """Cast nodes that read ``tensor``."""
    return [n for n in nodes_of(m, "Cast") if n.input[0] == tensor]


def attr(node: onnx.NodeProto, name: str):
    return helper.get_attribute_value(next(a for a in node.attribute if a.name == name))


def manifest_source(entry: dict, reference: onnx.ModelProto, samples: int = 2):
    """Validation inputs from a zoo manifest entry's input specs (shapes and ranges that suit the model)."""
    from amp_convert.inputs import make_source

    shapes = [f"{s['name']}={'x'.join(map(str, s['shape']))}" for s in entry["inputs"] if s["shape"]]
    ranges = []
    for s in entry["inputs"]:
        if "value" in s and s["value"] is not None:
            ranges.append(f"{s['name']}={s['value']}:{s['value'] + 1}")
        else:
            ranges.append(f"{s['name']}={s['low']}:{s['high']}")
    return make_source(reference, shapes=shapes, ranges=ranges, samples=samples)


def redundant_casts(model: onnx.ModelProto, original: onnx.ModelProto) -> list[str]:
    """Casts that change nothing, and exact round trips (fp16 -> fp32 -> fp16)
    that were not in the original model: a Cast pair between two nodes of the
    same precision."""
    inferred = onnx.shape_inference.infer_shapes(model)
    original_casts = {n.name for n in iter_nodes(original.graph) if n.op_type == "Cast" and n.name}
    problems = []

    def visit(graph: onnx.GraphProto, outer_types: dict[str, int], outer_producers: dict[str, onnx.NodeProto]) -> None:
        types = dict(outer_types)
        for v in (*graph.input, *graph.output, *graph.value_info):
            if v.type.HasField("tensor_type"):
                types[v.name] = v.type.tensor_type.elem_type
        types.update({t.name: t.data_type for t in graph.initializer})
        producers = dict(outer_producers)
        for node in graph.node:
            if node.op_type == "Cast":
                to = next(a.i for a in node.attribute if a.name == "to")
                types[node.output[0]] = to
                if types.get(node.input[0]) == to and node.name not in original_casts:
                    problems.append(f"identity Cast {node.name}")
                first = producers.get(node.input[0])
                if first is not None and first.op_type == "Cast" and types.get(first.input[0]) == to:
                    first_to = next(a.i for a in first.attribute if a.name == "to")
                    if (to, first_to) in EXACT_WIDENINGS and not {node.name, first.name} <= original_casts:
                        problems.append(f"round trip {first.name} -> {node.name}")
            for o in node.output:
                producers[o] = node
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g, types, producers)

    visit(inferred.graph, {}, {})
    return problems


def local_function_model(width: int, rows: int, opset: int, ir_version: int) -> onnx.ModelProto:
    """x -> MatMul(W) -> a call of the model's local function local::Lin
    (a Constant identity matrix and a MatMul) named "call" -> y; W is the
    identity too, so y equals x."""
    eye = np.eye(width, dtype=np.float32)
    body = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(eye, "cw")),
        helper.make_node("MatMul", ["a", "k"], ["o"]),
    ]
    function = helper.make_function("local", "Lin", ["a"], ["o"], body, opset_imports=[helper.make_opsetid("", opset)])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Lin", ["m"], ["y"], name="call", domain="local"),
    ]
    graph = helper.make_graph(nodes, "g", [value("x", shape=(rows, width))], [value("y", shape=(rows, width))], [init("W", eye)])
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("local", 1)]
    m = helper.make_model(graph, opset_imports=imports, functions=[function])
    m.ir_version = ir_version
    return m
