"""Emulation of low-precision execution with float32 kernels.

onnxruntime's CPU provider has no bf16 kernels, and runs many fp16 ops by
casting to fp32 internally without rounding in between, which hides fp16
overflow. The twin built here computes every op in float32 but rounds each
low-precision tensor to the low dtype (a Cast to fp16/bf16 and back), so
values that overflow or flush in fp16 do so here too. Tensor names are kept,
so the twin can be compared with the fp32 model tensor by tensor. Calls of
the model's local functions are inlined first: a body left as written would
meet the twin's float32 values with its own fp16 (onnxruntime refuses the
twin), and its low tensors would go unrounded. The inlined bodies' tensors
are new names, which no other model has to be compared with. A model whose
only low tensors are in such bodies is low precision too: the bodies it
calls are searched for the low types they make (:func:`_called_types`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, inliner, numpy_helper

from .calls import bind, called_bodies, local_functions
from .dtypes import LOW_DTYPES
from .errors import AmpError
from .external import widen_external
from .graph import GraphContext, NameGenerator, attribute_subgraphs, build_context, name_in_use, nested_graphs
from .lists import CONTAINER_TYPE_ATTRIBUTE_OPS, DTYPE_ATTRIBUTE_OPS, VALUE_ATTRIBUTE_OPS
from .schema import is_default_domain, model_opsets, opset_domain, signature
from .typeinfo import element_type, infer_types

LOW_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def detect_low_dtype(model: onnx.ModelProto) -> int | None:
    """The low dtype a (converted) model uses, if any: bf16 wins over fp16."""
    ctx = build_context(model.graph)
    infer_types(ctx, model_opsets(model))
    return low_dtype_of(ctx, model.functions)


def low_dtype_of(ctx: GraphContext, functions: Sequence[onnx.FunctionProto] = ()) -> int | None:
    """``detect_low_dtype`` of a typed context (``functions``: the model's
    local functions, whose bodies count where its nodes call them)."""
    seen = {t for c in ctx.walk() for t in c.types.values()}
    if functions and TensorProto.BFLOAT16 not in seen:
        seen.update(_called_types(ctx.graph, functions))
    for t in (TensorProto.BFLOAT16, TensorProto.FLOAT16):
        if t in seen:
            return t
    return None


def _called_types(graph: onnx.GraphProto, functions: Sequence[onnx.FunctionProto]) -> Iterator[int | None]:
    """The element types the bodies of the local functions a model (main
    graph ``graph``) calls make themselves, as each call binds their
    attributes: what their source ops (Cast, ...) and constants give, and
    what they and their subgraphs declare (a sequence's or an optional's
    elements too). The model's types hold none of a body's tensors, and a
    body's low tensor comes from one of these, or from an input the caller
    made (and typed) low."""
    for call in called_bodies(graph, local_functions(functions)):
        yield from map(element_type, call.function.value_info)
        yield from _made_types(call.function.node, call.bound)


def _made_types(nodes: Iterable[onnx.NodeProto], bound: dict[str, onnx.AttributeProto]) -> Iterator[int | None]:
    """The types a body's ``nodes`` name in their attributes (as the call
    binds them), and their subgraphs' (see :func:`_called_types`)."""
    for node in nodes:
        source = DTYPE_ATTRIBUTE_OPS.get(node.op_type) if is_default_domain(node.domain) else None
        for a in bind(node.attribute, bound):
            if a.name == source:
                yield a.i
            yield from (t.data_type for t in (a.t, *a.tensors))  # (0 where it holds none)
            yield from (s.values.data_type for s in (a.sparse_tensor, *a.sparse_tensors))
            for _, graph in attribute_subgraphs((a,)):
                yield from _graph_types(graph, bound)


def _graph_types(graph: onnx.GraphProto, bound: dict[str, onnx.AttributeProto]) -> Iterator[int | None]:
    """What a subgraph in a body declares and holds, and its nodes' types."""
    yield from map(element_type, (*graph.input, *graph.output, *graph.value_info))
    yield from (t.data_type for t in graph.initializer)
    yield from (s.values.data_type for s in graph.sparse_initializer)
    yield from _made_types(graph.node, bound)


def low_io(model: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs and outputs the model has in fp16/bf16 (--io-types low) -> their type."""
    return {
        v.name: v.type.tensor_type.elem_type
        for v in (*model.graph.input, *model.graph.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in LOW_TYPES
    }


def decide_emulation(
    mode: str, provider: str, low_elem: int | None, io_types: dict[str, int], role: str = "candidate"
) -> tuple[bool, str]:
    """Whether a model (the candidate, or a reference that is itself low
    precision) runs through its emulation twin, and why."""
    if low_elem is None:
        return False, f"the {role} has no fp16/bf16 tensors"
    if mode == "always":
        return True, "requested (`emulate` always)"
    if TensorProto.BFLOAT16 in io_types.values():
        # onnxruntime's Python API takes and returns no bfloat16 arrays.
        if mode == "never":
            raise AmpError(
                f"`emulate` never: the {role} has bfloat16 inputs or outputs, which onnxruntime cannot exchange with numpy"
            )
        return True, f"the {role} has bfloat16 inputs or outputs (run through the emulation, rounded to bfloat16)"
    if mode == "never":
        if low_elem == TensorProto.BFLOAT16 and provider == "cpu":
            raise AmpError(
                f"`emulate` never: the {role} computes in bfloat16 and onnxruntime's CPU provider has no bfloat16 "
                "kernels; use `provider` cuda or emulation"
            )
        return False, "requested (`emulate` never)"
    if provider == "cpu":
        if low_elem == TensorProto.BFLOAT16:
            return True, "onnxruntime's CPU provider has no bfloat16 kernels"
        return True, "onnxruntime's CPU provider computes many fp16 ops in fp32 without rounding between them"
    return False, "real low-precision run on CUDA"


def low_inputs(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The graph inputs ``model`` reads in fp16/bf16 (--io-types low) -> that
    dtype in numpy. Its twin reads them float32: whoever feeds the twin
    rounds their feeds to that dtype first, as a low feed would be (a
    graph output that is such an input is then rounded too, which no node
    of the twin could do)."""
    numpy = {d.onnx_type: d.numpy for d in LOW_DTYPES.values()}
    return {
        v.name: numpy[v.type.tensor_type.elem_type]
        for v in model.graph.input
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in LOW_TYPES
    }


def emulation_twin(model: onnx.ModelProto, base_dir: Path | None = None) -> onnx.ModelProto:
    """A float32 copy of ``model`` that rounds every fp16/bf16 tensor its
    nodes make (``base_dir``: where its external data lives, if it has
    any); its low graph inputs' feeds are rounded by the caller (see
    :func:`low_inputs`)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    if twin.functions:
        twin = _inline_functions(twin)
    ctx = build_context(twin.graph)
    infer_types(ctx, model_opsets(twin))
    names = NameGenerator(name_in_use(ctx))
    _rewrite_inner_first(ctx, names, base_dir)
    return twin


def _inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (consumed) with the calls of its local functions inlined,
    those in subgraphs and in inlined bodies too. onnx inlines no function
    importing another version of a domain than the model: one whose body
    means the same at the model's is made to import it (see
    :func:`_at_model_opsets`); one that cannot be stays a call. Every
    function stays declared as written: one left may call one inlined."""
    graph = model.graph
    # The inliner takes a serialized model: the main graph's tensors, up to
    # gigabytes, go to it as names only (all it reads of them) and come back.
    # Sparse ones' too: it makes new names unique against dense ones only.
    tensors = [graph.initializer.pop() for _ in range(len(graph.initializer))][::-1]
    sparse = [graph.sparse_initializer.pop() for _ in range(len(graph.sparse_initializer))][::-1]
    graph.initializer.extend(TensorProto(name=t.name) for t in (*tensors, *(s.values for s in sparse)))
    # A domain only functions import is imported by the model, at the first
    # version one asks for, for the inlined nodes of that domain.
    imported = set(model_opsets(model))
    for function in model.functions:
        for opset in function.opset_import:
            domain = opset_domain(opset.domain)
            if domain not in imported:
                model.opset_import.append(opset)
                imported.add(domain)
    declared, opsets = list(model.functions), model_opsets(model)
    del model.functions[:]
    model.functions.extend(_at_model_opsets(f, opsets) for f in declared)
    inlined = inliner.inline_local_functions(model)
    del inlined.graph.initializer[:]
    inlined.graph.initializer.extend(tensors)
    inlined.graph.sparse_initializer.extend(sparse)
    del inlined.functions[:]
    inlined.functions.extend(declared)
    return inlined


def _at_model_opsets(function: onnx.FunctionProto, opsets: dict[str, int]) -> onnx.FunctionProto:
    """``function`` importing the model's version (``opsets``) of each
    domain it imports another of, where each node of its body has the same
    schema at both: ONNX allows a function another version only so (onnx's
    checker holds a model to it; onnxruntime 1.31 reads a body at the
    model's default-domain version anyway), so the body means the same. As
    it is where a node's schema differs (a model onnx's checker refuses)."""
    moved = {d: v for d, v in model_opsets(function).items() if opsets.get(d, v) != v}
    if not moved:
        return function
    for node in chain(function.node, *(graph.node for graph in nested_graphs(function.node))):
        domain = opset_domain(node.domain)
        if domain in moved and _since(node.op_type, domain, moved[domain]) != _since(node.op_type, domain, opsets[domain]):
            return function
    matched = onnx.FunctionProto()
    matched.CopyFrom(function)
    for opset in matched.opset_import:
        opset.version = opsets.get(opset_domain(opset.domain), opset.version)
    return matched


def _since(op_type: str, domain: str, version: int) -> int | None:
    """The version the op's schema at ``version`` dates from (None: onnx has
    none, as for a local function's call or a custom op)."""
    found = signature(op_type, domain, version)
    return found.since_version if found is not None else None


def _rewrite_inner_first(ctx: GraphContext, names: NameGenerator, base_dir: Path | None) -> None:
    # Bodies first: rewriting a graph re-adds its nodes, which copies their bodies.
    for subs in ctx.subgraphs.values():
        for sub in subs:
            _rewrite_inner_first(sub, names, base_dir)
    _rewrite(ctx, names, base_dir)


def _float_value(tensor: onnx.TensorProto, base_dir: Path | None) -> None:
    if tensor.data_type in LOW_TYPES:
        if tensor.data_location == TensorProto.EXTERNAL and base_dir is not None:
            # Retyped, not read: the float32 copy is made tensor by tensor as the
            # twin is written for onnxruntime (no second fp32 weight set in memory).
            widen_external(tensor, TensorProto.FLOAT)
            return
        array = numpy_helper.to_array(tensor).astype(np.float32)
        new = numpy_helper.from_array(array, tensor.name)
        tensor.CopyFrom(new)


def _retype(values) -> None:
    for v in values:
        _float_type(v.type)


def _float_type(t: onnx.TypeProto) -> None:
    """Make the fp16/bf16 elements ``t`` declares float32, also those of a
    sequence, an optional, a map or a sparse tensor: the twin's values are
    float32 whatever holds them, and a declaration left low refuses it
    (a sequence of fp16 tensors as a graph output, or a Loop's state)."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        held = getattr(t, kind)
        if held.elem_type in LOW_TYPES:
            held.elem_type = TensorProto.FLOAT
    elif kind in ("sequence_type", "optional_type"):
        _float_type(getattr(t, kind).elem_type)
    elif kind == "map_type":
        _float_type(t.map_type.value_type)


def _float_attributes(node: onnx.NodeProto) -> None:
    """Make the fp16/bf16 type a node's attributes name float32: the
    ``dtype`` of its outputs, or the type of the optional it makes."""
    for a in node.attribute:
        if a.name in ("dtype", "output_datatype") and a.i in LOW_TYPES:
            a.i = TensorProto.FLOAT
        elif a.type == onnx.AttributeProto.TYPE_PROTO:
            _float_type(a.tp)


def _rewrite(ctx: GraphContext, names: NameGenerator, base_dir: Path | None) -> None:
    graph = ctx.graph
    new_nodes: list[onnx.NodeProto] = []
    _retype(graph.input)  # (the main graph's: see low_inputs)
    for tensor in graph.initializer:
        _float_value(tensor, base_dir)
    for sparse in graph.sparse_initializer:
        _float_value(sparse.values, base_dir)
    for node in ctx.nodes:
        if node.op_type in VALUE_ATTRIBUTE_OPS:
            for a in node.attribute:
                if a.name == "value":
                    _float_value(a.t, base_dir)
                elif a.name == "sparse_value":
                    _float_value(a.sparse_tensor.values, base_dir)
            new_nodes.append(node)
            continue
        low_outputs = [(k, o) for k, o in enumerate(node.output) if o and ctx.types.get(o) in LOW_TYPES]
        if low_outputs or node.op_type in CONTAINER_TYPE_ATTRIBUTE_OPS:
            _float_attributes(node)
        if not low_outputs:
            new_nodes.append(node)
            continue
        rounding = []
        for k, out in low_outputs:
            low = ctx.types[out]
            raw = names(f"{out}_emulated")
            node.output[k] = raw
            if node.op_type == "Cast":  # already rounds: only widen back
                rounding.append(helper.make_node("Cast", [raw], [out], to=TensorProto.FLOAT, name=names(f"{out}_widen")))
                continue
            rounded = names(f"{out}_rounded")
            rounding.append(helper.make_node("Cast", [raw], [rounded], to=low, name=names(f"{out}_round")))
            rounding.append(helper.make_node("Cast", [rounded], [out], to=TensorProto.FLOAT, name=names(f"{out}_widen")))
        new_nodes.append(node)
        new_nodes.extend(rounding)
    _retype(graph.output)
    _retype(graph.value_info)
    graph.ClearField("node")
    graph.node.extend(new_nodes)
