"""Estimated multiply-accumulates (MACs) of every node, to weigh float compute.

How the MACs are estimated. Shapes come from onnx's shape inference
(``onnx.shape_inference.infer_shapes`` with data propagation, not strict) on
a copy of the model without its tensor data: initializers of more than
:data:`_KEPT_ELEMENTS` elements, or held in external files, become graph
inputs of their type and shape (the values shape inference reads, such as a
Reshape's shape or a Slice's starts, are small). The value_info the model
already carries is kept. A dimension inference leaves symbolic counts as 1.
Where inference fails (a model over protobuf's 2 GB, say), and for models of
more than :data:`INFER_NODES` nodes (inference would cost them half their
conversion time), the shapes the model declares are used alone: its GEMMs
are then weighed by their weights (the activation rows as 1), which keeps
their shares in a transformer, where every GEMM reads as many rows. Only nodes with float compute count: those the plan
runs low or keeps fp32, not those it leaves unchanged, nor control-flow
nodes (their bodies' nodes are counted). Per node:

* MatMul (and FusedMatMul, DynamicQuantizeMatMul, MatMulIntegerToFloat,
  GemmFastGelu), Gemm, FusedGemm: batch x M x N x K from the input shapes
  (transposes read from transA/transB); with the activation's shape unknown,
  the weight's element count (M and the batch as 1);
* Conv, FusedConv, NhwcConv: output elements x (C/group x kernel size); with
  the output's shape unknown, from the input's (divided by the strides), or
  the weight's element count;
* ConvTranspose: input elements x (M/group x kernel size), or the weight's
  element count;
* Einsum: the product of the sizes of all its indices (and of the broadcast
  ellipsis dimensions);
* LSTM, GRU, RNN: sequence length x batch x (elements of W + elements of R);
* com.microsoft Attention, DecoderMaskedSelfAttention, PackedAttention: the
  QKV projection (tokens x weight elements) plus the attention itself,
  S x L x (D_qk + D_v) per batch, L the sequence plus the past;
  MultiHeadAttention, DecoderMaskedMultiHeadAttention, PackedMultiHeadAttention,
  GroupQueryAttention, SparseAttention and ONNX's Attention (opset 23): the
  attention part alone (their inputs are projected already), with packed
  QKV layouts and past key lengths read where they are given;
* MatMulNBits, MatMulBnb4: rows of A x K x N (attributes K and N);
* any other node: its output elements (1 for each output of unknown shape).

An estimate, not a count: it ranks where the compute is, with dynamic
dimensions as 1 and sparse attention counted dense.
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat

import numpy as np
import onnx
import onnx.shape_inference
from onnx import helper

from .graph import GraphContext, build_context, graph_initializers, node_subgraphs

# Initializers up to this many elements keep their values for shape inference.
_KEPT_ELEMENTS = 64
# Models of more nodes than this (in all their graphs) are not given to onnx's
# shape inference: it costs about 13 us a node, 1.3 s on a 100k-node
# transformer (half its conversion); their shapes are those they declare.
INFER_NODES = 20_000

Shape = Sequence[int]  # (a tuple, or the list an initializer's dims give)


def node_macs(model: onnx.ModelProto, ctx: GraphContext | None = None) -> dict[str, list[int]]:
    """The estimated MACs of every node (see the module's docstring), by
    graph path (as :class:`~amp_convert.plan.Plan` keys its entries) and node
    index. ``ctx``: the model's index, where the caller has it."""
    ctx = build_context(model.graph) if ctx is None else ctx
    graph = _inferred_graph(model) if sum(len(c.nodes) for c in ctx.walk()) <= INFER_NODES else model.graph
    out: dict[str, list[int]] = {}
    for c, g, declared, elements in _shape_tables(ctx, graph):
        # Output elements of every node at once (1 for each output of unknown shape, 1 for a node without any) ...
        table = c.output_slots()
        per_slot = np.fromiter(map(elements.get, table.names, repeat(1)), np.int64, len(table.names))
        estimates = np.zeros(len(c.nodes), np.int64)
        np.add.at(estimates, table.node, per_slot)
        estimates[table.counts == 0] = 1
        found = estimates.tolist()
        # ... then the formulas of the GEMM family, which read the shapes of
        # their inputs: the initializers' among them are read here (a large
        # model has tens of thousands), and the lookups are a dict's.
        handled, ops, domains = _HANDLED_OPS, c.ops, c.domains
        gemms = [i for i, op in enumerate(ops) if op in handled and (domains[i], op) in _HANDLERS]
        out[c.path] = found
        if not gemms:
            continue
        initializers = c.initializers if g is c.graph else graph_initializers(g)
        read = {name for i in gemms for name in c.ins[i] if name in initializers and name not in declared}
        weights = {name: initializers[name].dims[:] for name in read}  # (a list: a third of a tuple's time)
        get = declared.new_child(weights).get if isinstance(declared, ChainMap) else {**declared, **weights}.get
        for i in gemms:
            macs = _HANDLERS[domains[i], ops[i]](c.nodes[i], list(map(get, c.ins[i])), list(map(get, c.outs[i])))
            if macs is not None:
                found[i] = macs
    return out


# ------------------------------------------------------------------ shapes


def _inferred_graph(model: onnx.ModelProto) -> onnx.GraphProto:
    """The main graph of a copy of ``model`` without its large tensors' data,
    its shapes inferred (see the module's docstring); the copy's own graph,
    declarations alone, where inference fails."""
    shell = onnx.ModelProto(ir_version=model.ir_version)
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    source, graph = model.graph, shell.graph
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.sparse_initializer.extend(source.sparse_initializer)
    inputs = {v.name for v in source.input}
    for t in source.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and math.prod(t.dims) <= _KEPT_ELEMENTS:
            graph.initializer.append(t)
        elif t.name not in inputs:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        return onnx.shape_inference.infer_shapes(shell, data_prop=True).graph
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):  # (over 2 GB, or a model inference trips on)
        return graph


def _shape_tables(
    ctx: GraphContext, graph: onnx.GraphProto
) -> Iterator[tuple[GraphContext, onnx.GraphProto, Mapping[str, Shape], Mapping[str, int]]]:
    """Per graph of ``ctx``, outer before inner: the graph, the one read for
    it (``graph`` or a body of it: ``ctx``'s graph or an inferred copy, whose
    nodes and bodies are in the same order), the shapes it declares (then
    its parents') and their element counts (an absent output, "", holds none)."""
    pending: list[tuple[GraphContext, onnx.GraphProto, Mapping, Mapping[str, int]]] = [(ctx, graph, {}, {"": 0})]
    while pending:
        c, g, outer, outer_elements = pending.pop()
        own = {}
        for value in (*g.input, *g.value_info, *g.output):
            shape = _declared_shape(value)
            if shape is not None:
                own[value.name] = shape
        counts = dict(zip(own, map(math.prod, own.values()), strict=True))
        # (the main graph reads nothing from outside: plain dicts, the fastest lookups)
        if c.parent is None:
            declared, elements = own, {**counts, **outer_elements}
        else:
            declared, elements = ChainMap(own, outer), ChainMap(counts, outer_elements)
        yield c, g, declared, elements
        for i, subs in reversed(c.subgraphs.items()):
            for sub, (_, body) in zip(subs, node_subgraphs(g.node[i]), strict=True):
                pending.append((sub, body, declared, elements))


def _declared_shape(value: onnx.ValueInfoProto) -> Shape | None:
    """A tensor's shape, symbolic (and unset) dimensions as 1; None where its rank is unknown (or it is no tensor)."""
    t = value.type
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.dim_value > 0 else 1 for d in t.tensor_type.shape.dim)


# ------------------------------------------------------------ MAC formulas

Inputs = Sequence[Shape | None]
Handler = Callable[[onnx.NodeProto, Inputs, Inputs], int | None]


def _at(shapes: Inputs, k: int) -> Shape | None:
    return shapes[k] if k < len(shapes) else None


def _attribute(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _broadcast(a: Shape, b: Shape) -> Shape:
    """Numpy broadcasting of two (batch) shapes."""
    if not (a and b):  # (a GEMM's weight has no batch dimensions)
        return a or b
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) if min(x, y) != 0 else 0 for x, y in zip(a, b, strict=True))


def _matmul_macs(a: Shape | None, b: Shape | None, out: Shape | None, trans_a: bool = False, trans_b: bool = False) -> int | None:
    """batch x M x N x K of ``a @ b`` (transposed where asked); the weight's elements where ``a`` is unknown."""
    if a:
        k = a[-2] if trans_a and len(a) > 1 else a[-1]
        if b:
            m = (a[-1] if trans_a else a[-2]) if len(a) > 1 else 1
            n = (b[-2] if trans_b else b[-1]) if len(b) > 1 else 1
            return math.prod(_broadcast(a[:-2], b[:-2])) * m * n * k
        if out is not None:
            return math.prod(out) * k
    return math.prod(b) if b is not None else None


def _matmul(node: onnx.NodeProto, ins: Inputs, outs: Inputs) -> int | None:
    trans_a, trans_b = bool(_attribute(node, "transA", 0)), bool(_attribute(node, "transB", 0))
    return _matmul_macs(_at(ins, 0), _at(ins, 1), _at(outs, 0), trans_a, trans_b)


def _conv(node: onnx.NodeProto, ins: Inputs, outs: Inputs) -> int | None:
    w, x, out = _at(ins, 1), _at(ins, 0), _at(outs, 0)
    if not w:
        return None
    per_output = math.prod(w[1:])  # (C/group x kernel)
    if out is not None:
        return math.prod(out) * per_output
    if x is not None and len(x) == len(w):
        strides = _attribute(node, "strides", [1] * (len(x) - 2)) or [1] * (len(x) - 2)
        spatial = math.prod(-(-d // max(s, 1)) for d, s in zip(x[2:], strides, strict=False))
        return x[0] * w[0] * spatial * per_output
    return math.prod(w)


def _conv_transpose(_node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    x, w = _at(ins, 0), _at(ins, 1)
    if not w:
        return None
    return math.prod(x) * math.prod(w[1:]) if x is not None else math.prod(w)


def _einsum(node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    equation = _attribute(node, "equation", b"")
    terms = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    ellipsis: Shape = ()
    for term, shape in zip(terms, ins, strict=False):
        if shape is None:
            continue
        head, _, tail = term.partition("...")
        held = len(shape) - len(head) - len(tail) if "..." in term else 0
        if held < 0:
            return None
        for letter, d in zip(head + tail, shape[: len(head)] + shape[len(shape) - len(tail) :], strict=True):
            sizes[letter] = max(sizes.get(letter, 1), d)
        ellipsis = _broadcast(ellipsis, shape[len(head) : len(head) + held])
    return math.prod(sizes.values()) * math.prod(ellipsis) if sizes or ellipsis else None


def _recurrent(_node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    x, w, r = _at(ins, 0), _at(ins, 1), _at(ins, 2)
    if w is None and r is None:
        return None
    steps = x[0] * x[1] if x is not None and len(x) >= 2 else 1  # (sequence x batch, either layout)
    return steps * ((math.prod(w) if w is not None else 0) + (math.prod(r) if r is not None else 0))


def _fused_attention(node: onnx.NodeProto, ins: Inputs, _outs: Inputs, packed: bool = False) -> int | None:
    """Attention with its QKV projection: input (B, S, in) or packed tokens (T, in), weights (in, Dq + Dk + Dv)."""
    x, w = _at(ins, 0), _at(ins, 1)
    if not w:
        return None
    sizes = list(_attribute(node, "qkv_hidden_sizes", []) or [w[-1] // 3] * 3)
    d_qk, d_v = sizes[0], sizes[-1]
    if packed:  # (tokens of all sequences; each attends to its sequence: token_offset is (B, S))
        tokens = x[0] if x else 1
        offsets = _at(ins, 3)
        length = offsets[1] if offsets is not None and len(offsets) == 2 else 1
        return tokens * math.prod(w) + tokens * length * (d_qk + d_v)
    batch, seq = (x[0], x[1]) if x is not None and len(x) == 3 else (1, 1)
    past = _at(ins, 4)  # (2, B, N, P, H)
    length = seq + (past[3] if past is not None and len(past) == 5 else 0)
    return batch * seq * math.prod(w) + batch * seq * length * (d_qk + d_v)


def _attention(node: onnx.NodeProto, ins: Inputs, _outs: Inputs, past_slot: int) -> int | None:
    """The attention part of ops given Q, K and V: B x S x L x (D_qk + D_v)."""
    q, k, v, past = _at(ins, 0), _at(ins, 1), _at(ins, 2), _at(ins, past_slot)
    if not q or len(q) < 3:
        return None
    heads = _attribute(node, "num_heads", 0)
    if len(q) == 5:  # packed QKV (B, S, N, 3, H)
        batch, seq, d = q[0], q[1], q[2] * q[4]
    elif len(q) == 4:  # ONNX's Attention: (B, N, S, H)
        batch, seq, d, heads = q[0], q[2], q[1] * q[3], q[1]
    else:
        batch, seq, d = q
    length, d_v = seq, d
    if k is not None and len(k) in (3, 5):  # (B, L, D) or packed KV (B, L, N, 2, H)
        length = k[1]
        d_v = k[2] * k[4] if len(k) == 5 else d_v
    elif k is not None and len(k) == 4:  # (B, N, L, H)
        length = k[2]
    if v is not None and len(v) == 3:
        d_v = v[2]
    elif v is not None and len(v) == 4:  # (B, N_kv, L, H_v): every query head reads one
        d_v = (heads or v[1]) * v[3]
    if past is not None and len(past) == 4:  # (B, N, P, H)
        length += past[2]
    return batch * seq * length * (d + d_v)


def _grouped_attention(node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    """GroupQueryAttention, SparseAttention: query (B, S, D), or packed QKV (B, S, (N + 2 N_kv) H) without a key."""
    q, k, past = _at(ins, 0), _at(ins, 1), _at(ins, 3)
    if not q or len(q) != 3:
        return None
    batch, seq, d = q
    if k is None:
        heads, kv_heads = _attribute(node, "num_heads", 0), _attribute(node, "kv_num_heads", 0)
        if heads + 2 * kv_heads:
            d = d // (heads + 2 * kv_heads) * heads
    length = seq + (past[2] if past is not None and len(past) == 4 else 0)
    return 2 * batch * seq * length * d


def _packed_mha(node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    """PackedMultiHeadAttention: query (T, D) or packed QKV (T, N, 3, H); token_offset (B, S)."""
    q, offsets = _at(ins, 0), _at(ins, 4)
    if not q:
        return None
    d = q[1] * q[3] if len(q) == 4 else q[-1]
    length = offsets[1] if offsets is not None and len(offsets) == 2 else 1
    return 2 * q[0] * length * d


def _n_bits(node: onnx.NodeProto, ins: Inputs, _outs: Inputs) -> int | None:
    k, n = _attribute(node, "K", 0), _attribute(node, "N", 0)
    if not (k and n):
        return None
    a = _at(ins, 0)
    return (math.prod(a[:-1]) if a else 1) * k * n


def _plain_matmul(_node: onnx.NodeProto, ins: Inputs, outs: Inputs) -> int | None:
    return _matmul_macs(ins[0], ins[1], outs[0])  # (two inputs and an output, as the checker saw)


_MS = "com.microsoft"
_FORMULAS: dict[tuple[str, str], Handler] = {
    ("", "MatMul"): _plain_matmul,
    ("", "Gemm"): _matmul,
    ("", "Conv"): _conv,
    ("", "ConvTranspose"): _conv_transpose,
    ("", "Einsum"): _einsum,
    ("", "LSTM"): _recurrent,
    ("", "GRU"): _recurrent,
    ("", "RNN"): _recurrent,
    ("", "Attention"): lambda node, ins, outs: _attention(node, ins, outs, past_slot=4),
    (_MS, "FusedMatMul"): _matmul,
    (_MS, "FusedGemm"): _matmul,
    (_MS, "GemmFastGelu"): _plain_matmul,
    (_MS, "DynamicQuantizeMatMul"): _plain_matmul,
    (_MS, "MatMulIntegerToFloat"): _plain_matmul,
    (_MS, "FusedConv"): _conv,
    (_MS, "NhwcConv"): _conv,
    (_MS, "MatMulNBits"): _n_bits,
    (_MS, "MatMulBnb4"): _n_bits,
    (_MS, "Attention"): _fused_attention,
    (_MS, "DecoderMaskedSelfAttention"): _fused_attention,
    (_MS, "PackedAttention"): lambda node, ins, outs: _fused_attention(node, ins, outs, packed=True),
    (_MS, "MultiHeadAttention"): lambda node, ins, outs: _attention(node, ins, outs, past_slot=6),
    (_MS, "DecoderMaskedMultiHeadAttention"): lambda node, ins, outs: _attention(node, ins, outs, past_slot=5),
    (_MS, "PackedMultiHeadAttention"): _packed_mha,
    (_MS, "GroupQueryAttention"): _grouped_attention,
    (_MS, "SparseAttention"): _grouped_attention,
}
# By (domain, op), each default domain spelled both ways.
_HANDLERS = {**_FORMULAS, **{("ai.onnx", op): f for (domain, op), f in _FORMULAS.items() if domain == ""}}
_HANDLED_OPS = frozenset(op for _, op in _HANDLERS)
