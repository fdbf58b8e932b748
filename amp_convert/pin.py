"""Pinned selections: validation compares numerics, not tie-breaks.

Ops that choose elements by comparing values (TopK, NonMaxSuppression,
NonZero, ArgMax, ArgMin) turn a rounding difference between two near-equal
values into a different choice. After a detector's NonMaxSuppression one
swapped score moves whole rows of the boxes, and an element-wise comparison
of the outputs measures the tie-break, not the conversion.

So validation runs the candidate with each such choice *pinned* to the
reference's: the reference exposes the chosen indices, and the candidate
reads them as an extra graph input of the same name instead of computing
them. The candidate still makes its own choice (exposed under another name),
and how often it agrees is reported. The float values a choice is made from
are judged like outputs, so damage upstream of a selection still fails.

Only choices that land in the main graph can be fed: a selection op there,
or the integer outputs of an ``If`` whose branches select. A choice that is
itself a graph output is never pinned (it is compared as it is), and
choices inside ``Loop`` / ``Scan`` bodies are not pinned either (each
iteration would need its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from .dtypes import FLOAT_TYPES
from .graph import GraphContext
from .lists import SELECTION_OPS
from .schema import is_default_domain, model_opsets


@dataclass(frozen=True)
class Selection:
    """One choice made in the main graph."""

    name: str  # the int64 tensor holding the chosen indices
    node: str  # label of the node that makes it
    op_type: str  # a selection op, or If (a branch selects)
    inputs: tuple[str, ...] = ()  # float tensors the choice is made from (judged like outputs)


def find_selections(ctx: GraphContext) -> list[Selection]:
    """The choices of a typed main graph that validation can pin: those that
    pick float data (a classifier's ArgMax cast to an int32 label output
    picks nothing: its labels are compared as they are)."""
    outputs = set(ctx.output_names)
    found: list[Selection] = []
    for i, op in enumerate(ctx.ops):
        if not is_default_domain(ctx.domains[i]):
            continue
        outs, ins = ctx.outs[i], ctx.ins[i]
        if op in SELECTION_OPS:
            slot, value_slots = SELECTION_OPS[op]
            if slot >= len(outs) or not outs[slot] or outs[slot] in outputs:
                continue
            read = (ins[s] for s in value_slots if s < len(ins) and ins[s])
            values = tuple(name for name in read if ctx.type_of(name) in FLOAT_TYPES and name not in outputs)
            found.append(Selection(outs[slot], ctx.node_label(i), op, values))
        elif op == "If" and any(_selects(body) for body in ctx.subgraphs.get(i, ())):
            for name in outs:
                if name and name not in outputs and ctx.types.get(name) == TensorProto.INT64:
                    found.append(Selection(name, ctx.node_label(i), "If"))
    return [s for s in found if _picks_float_data(ctx, s)]


def _selects(body: GraphContext) -> bool:
    """Whether a body, or one nested in it, holds a selection op."""
    return any(op in SELECTION_OPS for c in body.walk() for op in c.ops)


def _picks_float_data(ctx: GraphContext, selection: Selection) -> bool:
    """Whether the choice picks float data: a float tensor downstream of it
    in the main graph (or computed by a node whose body reads it), or, for a
    TopK, its values. A Cast of the choice to float is its value, not data
    it picks (an ArgMax label cast to float is compared, not pinned)."""
    if selection.op_type == "TopK":
        values = ctx.outs[ctx.producer[selection.name]][0]
        if values and (values in ctx.consumers or values in ctx.output_names):
            return True
    seen, todo = {selection.name}, [selection.name]
    while todo:
        name = todo.pop()
        readers = [j for j, _ in ctx.readers(name)] + ctx.captured_by.get(name, [])
        for j in readers:
            for out in ctx.outs[j]:
                if not out or out in seen:
                    continue
                if ctx.types.get(out) in FLOAT_TYPES:
                    if ctx.ops[j] == "Cast":
                        continue
                    return True
                seen.add(out)
                todo.append(out)
    return False


def makes(ctx: GraphContext, selection: Selection) -> bool:
    """Whether the candidate makes ``selection`` the way the reference does (same tensor, same op)."""
    i = ctx.producer.get(selection.name)
    return i is not None and ctx.ops[i] == selection.op_type


def pin(model: onnx.ModelProto, selections: list[Selection], taken: set[str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of ``model`` whose main graph reads each selection from a graph
    input of the same name, and outputs its own choice under a new name
    (returned: selection -> own name). A pinned TopK's values are gathered
    at the pinned indices, so values and indices stay consistent (from
    opset 11, which has GatherElements; before, they stay its own: sorted,
    they differ from those at the pinned indices by the near-tie alone)."""
    gather = model_opsets(model).get("", 0) >= 11
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    graph = pinned.graph
    wanted = {s.name for s in selections}
    taken = set(taken)

    def fresh(base: str) -> str:
        name = f"{base}__amp_own"
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    own: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        nodes.append(node)
        for k, name in enumerate(node.output):
            if name not in wanted or name in own:
                continue
            own[name] = node.output[k] = fresh(name)
            if gather and node.op_type == "TopK" and k == 1 and node.output[0]:
                values = node.output[0]
                node.output[0] = fresh(values)
                axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
                nodes.append(helper.make_node("GatherElements", [node.input[0], name], [values], name=fresh(values), axis=axis))
    del graph.node[:]
    graph.node.extend(nodes)
    pinned_names = set(own)
    kept = [v for v in graph.value_info if v.name not in pinned_names]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for name in (s.name for s in selections if s.name in own):
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, None))
        graph.output.append(helper.make_tensor_value_info(own[name], TensorProto.INT64, None))
    return pinned, own
