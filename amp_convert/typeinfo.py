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
from .schema import Signature, is_default_domain, opset_domain, signature

NOT_A_TENSOR = -1  # sequences, optionals, maps: never converted

_LIKE_OPS = frozenset({"RandomNormalLike", "RandomUniformLike", "EyeLike", "Bernoulli"})
# Default-domain ops whose output type an attribute or a subgraph decides.
_SPECIAL_OPS = frozenset(
    {"Constant", "ConstantOfShape", "LayerNormalization", "RMSNormalization", "QuantizeLinear", "If", "Loop", "Scan"}
) | frozenset(DTYPE_ATTRIBUTE_OPS)


def declared_type(value: onnx.ValueInfoProto) -> int | None:
    """Element type written in a ValueInfoProto; None if it says nothing."""
    kind = value.type.WhichOneof("value")
    if kind == "tensor_type":
        return value.type.tensor_type.elem_type or None
    if kind is None:
        return None
    return NOT_A_TENSOR


def element_type(value: onnx.ValueInfoProto) -> int | None:
    """:func:`declared_type`, but of a sequence or an optional (at any
    depth) of tensors, their element type: what a function body's
    declarations are searched for low types by (a seq(tensor(float16))
    holds fp16 tensors), not what a value converts as (a sequence never)."""
    held = held_type(value.type)
    if held.WhichOneof("value") == "tensor_type":
        return held.tensor_type.elem_type or None
    return declared_type(value)


def held_type(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    """The type of what a value of this type holds past its sequences and
    optionals, at any depth (the type itself where it is neither)."""
    kind = type_proto.WhichOneof("value")
    while kind in ("sequence_type", "optional_type"):
        type_proto = getattr(type_proto, kind).elem_type
        kind = type_proto.WhichOneof("value")
    return type_proto


def infer_types(
    ctx: GraphContext, opsets: dict[str, int], rules: dict | None = None, assume_float: frozenset[str] = frozenset()
) -> None:
    """Fill ``ctx.types`` (and its subgraphs') with element types.

    ``assume_float`` names custom-domain ops (``domain::Op``) the user put on
    the white list: their outputs that nothing declares are taken to be
    float32 (listing the op says it computes in float), and recorded in
    ``ctx.assumed_float`` so the rewriter can declare them."""
    rules = {} if rules is None else rules  # (op, domain, output, input count) -> how to find its type
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
            infer_types(sub, opsets, rules, assume_float)
        missing = [k for k, name in enumerate(outs) if name and name not in types]
        if not missing:
            continue
        op, domain, ins = ctx.ops[i], ctx.domains[i], ctx.ins[i]
        if op in _SPECIAL_OPS and is_default_domain(domain):
            node = ctx.nodes[i]
            sig = _signature(op, domain, opsets)
            for k in missing:
                t = _output_type(ctx, i, node, k, sig, subs)
                if t:
                    types[outs[k]] = t
            continue
        for k in missing:
            t = _by_rule(ctx, ins, _rule(rules, opsets, op, domain, k, len(ins)))
            if not t and assume_float and not is_default_domain(domain) and f"{domain}::{op}" in assume_float:
                t = TensorProto.FLOAT
                ctx.assumed_float.add(outs[k])
            if t:
                types[outs[k]] = t


def _rule(rules: dict, opsets: dict[str, int], op: str, domain: str, k: int, n_inputs: int) -> tuple[tuple[int, ...], int]:
    """The :func:`_generic_rule` of output ``k`` of an ``op`` node of
    ``n_inputs`` inputs, worked out once per model (``rules``: the cache)."""
    key = (op, domain, k, n_inputs)
    rule = rules.get(key)
    if rule is None:
        rule = rules[key] = _generic_rule(_signature(op, domain, opsets), k, n_inputs)
    return rule


def _signature(op: str, domain: str, opsets: dict[str, int]) -> Signature | None:
    opset = opsets.get(opset_domain(domain))
    return signature(op, domain, opset) if opset is not None else None


def _generic_rule(sig: Signature | None, k: int, n_inputs: int) -> tuple[tuple[int, ...], int]:
    """(input slots whose type output ``k`` takes, first known wins; the type
    when none is known) from the schema's type variables."""
    if sig is None:
        return (), 0
    type_str = sig.output_type(k)
    if type_str is None:
        return (), 0
    if type_str not in sig.allowed:
        return (), TYPE_STR_TO_ELEM.get(type_str, NOT_A_TENSOR)
    slots = tuple(slot for slot in range(n_inputs) if sig.input_type(slot) == type_str)
    allowed = sig.allowed[type_str]
    if len(allowed) == 1:
        return slots, next(iter(allowed))
    return slots, 0 if allowed else NOT_A_TENSOR


def _output_type(ctx: GraphContext, i: int, node: onnx.NodeProto, k: int, sig: Signature | None, subs) -> int:
    special = _special_output_type(ctx, node, k, subs)
    if special is not None:
        return special
    return _by_rule(ctx, ctx.ins[i], _generic_rule(sig, k, len(ctx.ins[i])))


def _by_rule(ctx: GraphContext, ins: list[str], rule: tuple[tuple[int, ...], int]) -> int:
    """The type a rule of :func:`_generic_rule` gives: the first known type of its input slots, else its fallback."""
    slots, fallback = rule
    for slot in slots:
        name = ins[slot]
        if name:
            t = ctx.types.get(name) or ctx.type_of(name)
            if t:
                return t
    return fallback


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
