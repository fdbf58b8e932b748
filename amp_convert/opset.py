"""Opset upgrade, only where a rewrite needs it.

The output keeps the input's IR version and opsets, except that Cast to
bfloat16 needs default-domain opset 13, and the user may ask for a newer
opset (``--target-opset 22``: many ops admit bfloat16 only from opset 22).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx.version_converter
from onnx import helper, numpy_helper

from .constant_stats import attribute_constant
from .errors import AmpError
from .graph import NameGenerator, NodeLabels, nested_graphs, node_subgraphs
from .ortschema import check_with_extras
from .ortversions import min_ir_for_opset
from .schema import is_default_domain, model_opsets


def check_target_opset(model: onnx.ModelProto, target: int | None) -> None:
    """Refuse a requested default-domain opset below the model's: opsets are
    only ever upgraded (lowering one could change what an op computes)."""
    current = model_opsets(model).get("", 0)
    if target is not None and target < current:
        raise AmpError(
            f"`target_opset` {target} is below the model's opset {current}: lowering an opset is not supported; "
            f"give {current} or higher, or leave `target_opset` out"
        )


def upgrade_opset(model: onnx.ModelProto, target: int, strict: bool = False) -> tuple[onnx.ModelProto, str | None]:
    """Return ``model`` at default-domain opset ``target`` (never lower), and a
    note saying what changed (None if nothing did). ``strict``: the upgraded
    model must pass strict shape inference (the full check's), or the upgrade
    is refused: a declared shape the input got wrong may pass at its opset
    and not at the new one, and would fail the converted model's check."""
    current = model_opsets(model).get("", 0)
    if target <= current:
        return model, None
    ir_version = model.ir_version
    prepared = _prepared(model, current, target)
    try:
        upgraded = onnx.version_converter.convert_version(prepared, target)
    except Exception as e:  # the converter raises plain RuntimeErrors with C++ messages
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AmpError(f"cannot upgrade the model from opset {current} to {target}: {first}") from None
    if current <= 10 < target:  # (at opset 10 Resize is Resize-10: the old behaviour, nothing to mend)
        _keep_old_resize(upgraded)
    _keep_names(prepared, upgraded)
    upgraded.ir_version = max(ir_version, min_ir_for_opset(target))
    if strict:
        _check_inference(upgraded, current, target)
    if model.functions and not upgraded.functions:  # (the version converter drops local functions)
        upgraded.functions.extend(model.functions)  # (each declares the opsets its body is read at)
        return upgraded, f"opset upgraded from {current} to {target} (local functions kept as they are, at their own opsets)"
    return upgraded, f"opset upgraded from {current} to {target}"


def _check_inference(upgraded: onnx.ModelProto, current: int, target: int) -> None:
    """Strict shape and type inference on the upgraded graph (its tensors'
    data is not read: it may be external and not loaded)."""
    try:
        check_with_extras(lambda: onnx.shape_inference.infer_shapes(upgraded, check_type=True, strict_mode=True), upgraded)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as e:
        detail = " ".join(str(e).split())[:400]
        raise AmpError(
            f"upgraded from opset {current} to {target}, the model fails ONNX shape inference ({detail}): the "
            "input declares a shape or type that inference at that opset contradicts; repair or re-export the "
            "model, or give a `target_opset` it passes at"
        ) from None


# onnx's version converter changes what some ops compute; what it is given
# and what it gives back is mended here so that the upgraded model computes
# what the input did (as onnxruntime runs both), or the upgrade is refused.


def _prepared(model: onnx.ModelProto, current: int, target: int) -> onnx.ModelProto:
    """What the version converter is given: unnamed nodes named by their
    labels (the converter adds nodes, which would shift the labels that
    plans and --keep-fp32 rules use), and each Hardmax of opset 12 or
    below computed over two dimensions, the one case its adapter keeps."""
    graphs = list(_graphs(model.graph))
    for graph in graphs:
        if current < 9 and any(n.op_type == "Scan" and is_default_domain(n.domain) for n in graph.node):
            raise AmpError(
                f"cannot upgrade the model from opset {current} to {target}: onnx's version converter drops Scan-8's "
                "batch axis (the model's inputs would change shape); export the model at opset 9 or later"
            )
    hardmax = current <= 12 < target and any(_is_hardmax(n) for g in graphs for n in g.node)
    if not hardmax and all(n.name for g in graphs for n in g.node):
        return model
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    graphs = list(_graphs(prepared.graph))
    for graph in graphs:
        labels = NodeLabels([n.name for n in graph.node], [n.op_type for n in graph.node])
        for i, node in enumerate(graph.node):
            if not node.name:
                node.name = labels[i]
    if hardmax:
        if current < 5:
            raise AmpError(f"cannot upgrade Hardmax from opset {current} to {target} faithfully: export at opset 5 or later")
        taken = {n for g in graphs for n in _names(g)}
        names = NameGenerator(taken.__contains__)
        for graph in reversed(graphs):  # (bodies first: rewriting a graph copies its nodes, bodies and all)
            _hardmax_over_2d(graph, names)
    return prepared


def _hardmax_over_2d(graph: onnx.GraphProto, new: NameGenerator) -> None:
    """Hardmax before opset 13 flattens its input to 2-D at ``axis``; from
    13 on it works along that one axis, and the converter keeps the axis.
    Written as Flatten, Hardmax over axis 1, and Reshape back, it computes
    the same at either opset."""
    if not any(map(_is_hardmax, graph.node)):
        return
    nodes = []
    for node in graph.node:
        if not _is_hardmax(node):
            nodes.append(node)
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        x, y = node.input[0], node.output[0]
        shape, flat, hard = new(f"{x}_shape"), new(f"{x}_2d"), new(f"{y}_2d")
        nodes += [
            helper.make_node("Shape", [x], [shape], name=new(f"{node.name}_shape")),
            helper.make_node("Flatten", [x], [flat], name=new(f"{node.name}_flatten"), axis=axis),
            helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1),
            helper.make_node("Reshape", [hard, shape], [y], name=new(f"{node.name}_reshape")),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def _is_hardmax(node: onnx.NodeProto) -> bool:
    return node.op_type == "Hardmax" and is_default_domain(node.domain)


def _keep_old_resize(model: onnx.ModelProto) -> None:
    """Upsample and Resize-10 map output to input coordinates as
    ``x / scale`` (Resize-11's "asymmetric"), and onnxruntime rounds their
    nearest neighbour down where a scale enlarges and up where it shrinks;
    the converter leaves Resize-11's defaults (half_pixel, round_prefer_floor).
    Every Resize of an upgraded opset-10 model is one of those: its modes
    are set to match. A nearest Resize whose scales are not constant, or
    enlarge one axis and shrink another, has no such mode: refused."""
    for graph, constants in _graphs_with_constants(model.graph, {}):
        for node in graph.node:
            if node.op_type != "Resize" or not is_default_domain(node.domain):
                continue
            modes = {"coordinate_transformation_mode": b"asymmetric"}
            mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
            if mode == b"nearest":
                tensor = constants.get(node.input[2]) if len(node.input) > 2 else None
                external = tensor is not None and tensor.data_location == onnx.TensorProto.EXTERNAL
                scales = numpy_helper.to_array(tensor) if tensor is not None and not external else None
                scaled = set() if scales is None else {bool(s > 1) for s in scales.ravel().tolist() if s != 1}
                if scales is None or len(scaled) > 1:
                    why = "it enlarges one axis and shrinks another"
                    if scales is None:
                        why = "its scales are in external data" if external else "its scales are not constant"
                    raise AmpError(
                        f"cannot upgrade Resize node {node.name or node.output[0]!r} (Upsample or opset-10 Resize, nearest mode) "
                        f"faithfully: {why}; export the model at opset 11 or later"
                    )
                modes["nearest_mode"] = b"ceil" if scaled == {False} else b"floor"
            kept = [a for a in node.attribute if a.name not in modes]
            del node.attribute[:]
            node.attribute.extend([*kept, *(helper.make_attribute(k, v) for k, v in modes.items())])


def _keep_names(given: onnx.ModelProto, upgraded: onnx.ModelProto) -> None:
    """A node the converter made anew in place of a named one (Resize for
    Upsample) takes its name: labels and --keep-fp32 rules still mean it.
    Known by the tensor it writes, which keeps its name."""
    writers = {
        node.output[0]: node.name for g in _graphs(given.graph) for node in g.node if node.output and node.output[0] and node.name
    }
    for graph in _graphs(upgraded.graph):
        taken = {node.name for node in graph.node}
        for node in graph.node:
            name = writers.get(node.output[0]) if not node.name and node.output and node.output[0] else None
            if name is not None and name not in taken:
                node.name = name
                taken.add(name)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and every graph nested in its nodes' attributes, each before those nested in it."""
    yield graph
    yield from nested_graphs(graph.node)


def _graphs_with_constants(graph: onnx.GraphProto, outer: dict) -> Iterator[tuple[onnx.GraphProto, dict[str, onnx.TensorProto]]]:
    """Each graph (as :func:`_graphs`) with the constants it sees: its own
    and outer scopes' initializers and Constant values (tensors, read by
    whoever needs one: the weights stay where they are)."""
    constants = dict(outer)
    constants.update((t.name, t) for t in graph.initializer)
    for node in graph.node:
        found = (
            attribute_constant(node, node.output[0]) if node.op_type == "Constant" and is_default_domain(node.domain) else None
        )
        if found is not None:
            constants.update((found,))
    yield graph, constants
    for node in graph.node:
        for _, body in node_subgraphs(node):
            yield from _graphs_with_constants(body, constants)


def _names(graph: onnx.GraphProto) -> Iterator[str]:
    """Every tensor and node name the graph holds."""
    for node in graph.node:
        yield node.name
        yield from node.input
        yield from node.output
    for v in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        yield v.name
