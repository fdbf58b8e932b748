"""Small edits on an onnx graph that the rewrite makes: new nodes put in
place, reads renamed, an int attribute set, the graph inputs that
initializers need before IR version 4."""

from __future__ import annotations

from itertools import chain

import onnx
from onnx import helper

from .graph import GraphContext, node_subgraphs, sort_nodes


def declare_initializers(root: GraphContext) -> None:
    """Before IR version 4 every initializer is also a graph input of its
    type: the initializers the rewrite added get one, and the inputs of
    those it retyped take the new type."""
    for ctx in root.walk():
        graph = ctx.graph
        declared = {v.name: v for v in graph.input}
        for tensor in graph.initializer:
            v = declared.get(tensor.name)
            if v is None:
                graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
            elif v.type.HasField("tensor_type") and v.type.tensor_type.elem_type != tensor.data_type:
                v.type.tensor_type.elem_type = tensor.data_type


def place_nodes(ctx: GraphContext, top: list[onnx.NodeProto], after: dict[int, list[onnx.NodeProto]]) -> None:
    """Put the nodes ``top`` first and ``after[i]`` right after node ``i``,
    keeping the order topological."""
    container = ctx.graph.node
    places = [-1.0] * len(top)
    added = list(top)
    for i, nodes in after.items():
        places.extend(i + k / (len(nodes) + 1) for k in range(1, len(nodes) + 1))
        added.extend(nodes)
    # Appended, then sorted into place: sorting moves the nodes; writing the list anew would copy every one of them.
    n = len(container)
    container.extend(added)
    sort_nodes(container, [*range(n), *places])  # (one per original node, one per node added)


def cast_node(source: str, target: str, to: int, name: str) -> onnx.NodeProto:
    """A Cast of ``source`` to element type ``to``, writing ``target``."""
    return helper.make_node("Cast", [source], [target], name=name, to=to)


def rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """``graph``'s reads of ``old`` read ``new``: its nodes', its bodies'
    that do not define ``old`` themselves, and its outputs and value_info name it."""
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new
        for _, body in node_subgraphs(node):
            defined = chain(body.input, body.initializer, (t.values for t in body.sparse_initializer))
            if not any(v.name == old for v in defined) and all(old not in n.output for n in body.node):
                rename_reads(body, old, new)
    for value in chain(graph.output, graph.value_info):
        if value.name == old:
            value.name = new


def set_int_attribute(node: onnx.NodeProto, name: str, value: int) -> None:
    for a in node.attribute:
        if a.name == name:
            a.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))
