"""Element-type inference: the dtype of every tensor, before conversion.

Declared types (graph inputs and outputs, value_info, initializers) are taken
as they are; the rest are propagated through the schemas' type variables in
one pass in topological order. This is much cheaper than full ONNX shape
inference, which the converter does not need: it only asks "is this tensor
float32?".
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from .dtypes import TYPE_STR_TO_ELEM
from .graph import GraphContext
from .lists import DTYPE_ATTRIBUTE_OPS
from .schema import Signature, is_default_domain, signature

NOT_A_TENSOR = -1  # sequences, optionals, maps: never converted

_LIKE_OPS = frozenset({"RandomNormalLike", "RandomUniformLike", "EyeLike", "Bernoulli"})


def declared_type(value: onnx.ValueInfoProto) -> int | None:
    """Element type written in a ValueInfoProto; None if it says nothing."""
    kind = value.type.WhichOneof("value")
    if kind == "tensor_type":
        return value.type.tensor_type.elem_type or None
    if kind is None:
        return None
    return NOT_A_TENSOR


def infer_types(ctx: GraphContext, opsets: dict[str, int]) -> None:
    """Fill ``ctx.types`` (and its subgraphs') with element types."""
    types = ctx.types
    g = ctx.graph
    for value in (*g.input, *g.value_info, *g.output):
        t = declared_type(value)
        if t is not None:
            types[value.name] = t
    for name, tensor in ctx.initializers.items():
        types[name] = tensor.data_type
    subgraphs = ctx.subgraphs
    for i, outs in enumerate(ctx.outs):
        subs = subgraphs.get(i, ()) if subgraphs else ()
        for sub in subs:
            infer_types(sub, opsets)
        missing = [k for k, name in enumerate(outs) if name and name not in types]
        if not missing:
            continue
        node = ctx.nodes[i]
        domain = node.domain
        opset = opsets.get("" if is_default_domain(domain) else domain)
        sig = signature(ctx.ops[i], domain, opset) if opset is not None else None
        for k in missing:
            t = _output_type(ctx, i, node, k, sig, subs)
            if t:
                types[outs[k]] = t


def _output_type(ctx: GraphContext, i: int, node: onnx.NodeProto, k: int, sig: Signature | None, subs) -> int:
    if is_default_domain(node.domain):
        special = _special_output_type(ctx, node, k, subs)
        if special is not None:
            return special
    if sig is None:
        return 0
    type_str = sig.output_type(k)
    if type_str is None:
        return 0
    if type_str not in sig.allowed:
        return TYPE_STR_TO_ELEM.get(type_str, NOT_A_TENSOR)
    types = ctx.types
    for slot, name in enumerate(ctx.ins[i]):
        if name and sig.input_type(slot) == type_str:
            t = types.get(name) or ctx.type_of(name)
            if t:
                return t
    allowed = sig.allowed[type_str]
    if len(allowed) == 1:
        return next(iter(allowed))
    if not allowed:  # only sequence / optional types admitted
        return NOT_A_TENSOR
    return 0


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    for a in node.attribute:
        if a.name == name:
            return a
    return None


def _special_output_type(ctx: GraphContext, node: onnx.NodeProto, k: int, subs) -> int | None:
    """Ops whose output type comes from an attribute or a subgraph."""
    op = node.op_type
    if op == "Constant":
        for a in node.attribute:
            if a.name == "value":
                return a.t.data_type
            if a.name == "sparse_value":
                return a.sparse_tensor.values.data_type
            if a.name in ("value_float", "value_floats"):
                return TensorProto.FLOAT
            if a.name in ("value_int", "value_ints"):
                return TensorProto.INT64
            if a.name in ("value_string", "value_strings"):
                return TensorProto.STRING
        return 0
    if op == "ConstantOfShape":
        a = _attr(node, "value")
        return a.t.data_type if a is not None else TensorProto.FLOAT
    if op in DTYPE_ATTRIBUTE_OPS:
        a = _attr(node, DTYPE_ATTRIBUTE_OPS[op])
        if a is not None:
            return a.i
        if op in _LIKE_OPS and node.input and node.input[0]:
            return ctx.type_of(node.input[0])
        return TensorProto.FLOAT if op != "Cast" else 0
    if op in ("LayerNormalization", "RMSNormalization") and k > 0:  # Mean / InvStdDev: stash_type
        a = _attr(node, "stash_type")
        return a.i if a is not None else TensorProto.FLOAT
    if op == "QuantizeLinear":
        a = _attr(node, "output_dtype")
        if a is not None and a.i:
            return a.i
        if len(node.input) > 2 and node.input[2]:
            return ctx.type_of(node.input[2])
        return TensorProto.UINT8
    if op in ("If", "Loop", "Scan") and subs:
        body = subs[0]
        offset = 1 if op == "Loop" else 0  # Loop's body outputs start with the condition
        outputs = body.output_names
        if k + offset < len(outputs):
            return body.types.get(outputs[k + offset], 0)
        return 0
    return None
