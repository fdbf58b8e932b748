"""Folding an inference-mode BatchNormalization into the Conv before it.

Such a BatchNormalization is an affine map per output channel, ``y = x * s +
(beta - mean * s)`` with ``s = gamma / sqrt(var + epsilon)``, and the Conv
before it is linear in its weights: ``W' = W * s``, ``B' = (B - mean) * s +
beta`` compute the pair in one node. Done in float64 and stored as float32,
the statistics are then used in full precision whatever the Conv later runs
in, and no Cast pair around the BatchNormalization blocks onnxruntime's
fusions of the Conv with what follows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .graph import NameGenerator, NodeLabels, nested_graphs
from .schema import is_default_domain

_FOLDS_INTO = frozenset({"Conv", "ConvTranspose"})


@dataclass(frozen=True)
class FoldResult:
    """What :class:`FoldBatchNormalization` did to a model.

    ``folded``: (Conv, BatchNormalization) label pairs, in node order; a
    label is the node's name, or ``OpType_index`` for an unnamed one (as
    plans call nodes, at their index before the fold)."""

    modified: bool
    folded: list[tuple[str, str]] = field(default_factory=list)


class FoldBatchNormalization:
    """Folds each BatchNormalization that these rules allow into the Conv
    (or ConvTranspose) before it, in the main graph only (subgraphs are left
    as they are):

    * the BatchNormalization is of the default domain and in inference mode:
      one output, ``training_mode`` absent or 0 (``is_test`` not 0 and
      ``spatial`` 1, where an old opset has them);
    * its data input is the only output of a default-domain Conv or
      ConvTranspose, read by no other node (a subgraph's read counts) and
      not a graph output;
    * the Conv's weight and bias (if any) and the four BatchNormalization
      parameters are float32 initializers stored in the model (not external
      data, not graph inputs that a caller could override, except before IR
      version 4, where every initializer is one), the parameters of one
      value per output channel; any group count and dilations;
    * the folded values are finite, and ``accept`` (if given) takes them.

    The fused node is the Conv itself, keeping its node name, with the
    BatchNormalization's output as its output: the tensors downstream and
    the graph outputs keep their names; the Conv's own output tensor (and
    its value_info) no longer exists. A weight or bias another node reads
    too is copied under a new name; a parameter no node reads any more is
    dropped. Unnamed nodes after the first folded one take their label as
    their name, so a label means the same node before and after the fold.

    The model is changed in place: give it a copy to keep the original.
    """

    def __init__(
        self,
        skip: Callable[[str], bool] | None = None,
        accept: Callable[[np.ndarray, np.ndarray], bool] | None = None,
    ) -> None:
        """``skip(label)``: True leaves that BatchNormalization as it is.
        ``accept(weight, bias)``: whether the folded float32 values may be
        used (e.g. that the low dtype holds them); None takes them all."""
        self.skip = skip
        self.accept = accept

    def __call__(self, model: onnx.ModelProto) -> FoldResult:
        """Fold what the rules allow in ``model`` (in place); say what."""
        graph = model.graph
        nodes = list(graph.node)
        if not any(n.op_type == "BatchNormalization" for n in nodes):  # (the index below costs more than the scan)
            return FoldResult(False)
        labels = NodeLabels([n.name for n in nodes], [n.op_type for n in nodes])
        ir_before_4 = model.ir_version < 4
        inputs = {v.name for v in graph.input}
        initializers = {t.name: t for t in graph.initializer if ir_before_4 or t.name not in inputs}
        outputs = {v.name for v in graph.output}
        reads = Counter(name for node in nodes for name in node.input if name)
        nested = _nested_reads(nodes)
        producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
        fresh = NameGenerator(_names_in_use(graph).__contains__)
        folded: list[tuple[str, str]] = []
        removed: set[int] = set()
        for j, bn in enumerate(nodes):
            if bn.op_type != "BatchNormalization" or not is_default_domain(bn.domain) or len(bn.input) != 5:
                continue
            if not _inference_mode(bn) or (self.skip is not None and self.skip(labels[j])):
                continue
            x = bn.input[0]
            i = producer.get(x)
            if i is None or reads[x] != 1 or x in nested or x in outputs:
                continue
            conv = nodes[i]
            if conv.op_type not in _FOLDS_INTO or not is_default_domain(conv.domain) or len(conv.output) != 1:
                continue
            arrays = self._folded(conv, bn, initializers)
            if arrays is None:
                continue
            weight, bias = arrays
            shared = lambda name: reads[name] > 1 or name in nested or name in outputs  # noqa: E731
            for slot, values in ((1, weight), (2, bias)):
                old = conv.input[slot] if slot < len(conv.input) else ""
                if old and not shared(old):
                    initializers[old].CopyFrom(numpy_helper.from_array(values, old))
                    continue
                name = fresh(f"{old or labels[i]}_folded" if old else f"{labels[i]}_bias_folded")
                tensor = numpy_helper.from_array(values, name)
                graph.initializer.append(tensor)
                initializers[name] = graph.initializer[-1]
                if ir_before_4:
                    graph.input.append(onnx.helper.make_tensor_value_info(name, tensor.data_type, tensor.dims))
                if old:
                    reads[old] -= 1
                    conv.input[slot] = name
                else:
                    del conv.input[2:]
                    conv.input.append(name)
                reads[name] = 1
            conv.output[0] = bn.output[0]
            for name in bn.input:
                reads[name] -= 1
            removed.add(j)
            folded.append((labels[i], labels[j]))
        if not folded:
            return FoldResult(False)
        self._drop(graph, nodes, removed, labels, reads, nested, outputs, initializers, ir_before_4)
        return FoldResult(True, folded)

    def _folded(
        self, conv: onnx.NodeProto, bn: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The fused node's weight and bias, float32, or None where a rule forbids the fold."""
        names = [conv.input[1] if len(conv.input) > 1 else "", conv.input[2] if len(conv.input) > 2 else "", *bn.input[1:]]
        if not names[0]:
            return None
        arrays = []
        for k, name in enumerate(names):
            tensor = initializers.get(name) if name else None
            if tensor is None:
                if k == 1 and not name:  # (a Conv without a bias)
                    arrays.append(None)
                    continue
                return None
            if tensor.data_type != onnx.TensorProto.FLOAT or tensor.data_location == onnx.TensorProto.EXTERNAL:
                return None
            arrays.append(numpy_helper.to_array(tensor).astype(np.float64))
        w, b, gamma, beta, mean, var = arrays
        group = next((a.i for a in conv.attribute if a.name == "group"), 1)
        if w.ndim < 3 or group < 1:
            return None
        transpose = conv.op_type == "ConvTranspose"
        channels = w.shape[1] * group if transpose else w.shape[0]
        if any(a is not None and a.shape != (channels,) for a in (b, gamma, beta, mean, var)):
            return None
        if transpose and w.shape[0] % group:
            return None
        epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        with np.errstate(all="ignore"):
            scale = gamma / np.sqrt(var + np.float64(np.float32(epsilon)))
            if transpose:  # (W is (C, M / group, k...): output channel g * M / group + m scales W[g * C / group + c, m])
                grouped = w.reshape(group, w.shape[0] // group, w.shape[1], *w.shape[2:])
                fused = (grouped * scale.reshape(group, 1, w.shape[1], *[1] * (w.ndim - 2))).reshape(w.shape)
            else:
                fused = w * scale.reshape(channels, *[1] * (w.ndim - 1))
            shift = ((b if b is not None else 0.0) - mean) * scale + beta
            weight, bias = fused.astype(np.float32), shift.astype(np.float32)
        if not (np.isfinite(weight).all() and np.isfinite(bias).all()):
            return None
        if self.accept is not None and not self.accept(weight, bias):
            return None
        return weight, bias

    @staticmethod
    def _drop(
        graph: onnx.GraphProto,
        nodes: list[onnx.NodeProto],
        removed: set[int],
        labels: NodeLabels,
        reads: Counter,
        nested: set[str],
        outputs: set[str],
        initializers: dict[str, onnx.TensorProto],
        ir_before_4: bool,
    ) -> None:
        """Remove the folded BatchNormalization nodes, the initializers no
        node reads any more and the value_info of the tensors gone; name
        the unnamed nodes whose label the removal would change."""
        first = min(removed)
        kept = []
        for k, node in enumerate(nodes):
            if k in removed:
                continue
            if k > first and not node.name:
                node.name = labels[k]
            kept.append(node)
        produced = {name for node in kept for name in node.output}
        del graph.node[:]
        graph.node.extend(kept)
        unread = {name for name, n in reads.items() if n <= 0 and name in initializers}
        unread -= nested | outputs
        if unread:
            tensors = [t for t in graph.initializer if t.name not in unread]
            del graph.initializer[:]
            graph.initializer.extend(tensors)
            if ir_before_4:
                declared = [v for v in graph.input if v.name not in unread]
                del graph.input[:]
                graph.input.extend(declared)
        gone = {name for k in removed for name in nodes[k].input[:1]} - produced
        if gone:
            info = [v for v in graph.value_info if v.name not in gone]
            del graph.value_info[:]
            graph.value_info.extend(info)


def _inference_mode(node: onnx.NodeProto) -> bool:
    """A BatchNormalization that normalizes with its given statistics, per channel."""
    if not node.output or not node.output[0] or any(node.output[1:]):
        return False
    attributes = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    return attributes.get("training_mode", 0) == 0 and attributes.get("is_test", 1) != 0 and attributes.get("spatial", 1) == 1


def _nested_reads(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every name the graphs nested in ``nodes`` read or give as an output (a
    superset of what they capture from the outer scope)."""
    names: set[str] = set()
    for g in nested_graphs(nodes):
        names.update(name for node in g.node for name in node.input)
        names.update(v.name for v in g.output)
    return names


def _names_in_use(graph: onnx.GraphProto) -> set[str]:
    """The tensor and node names of ``graph`` and the graphs nested in it (a new name takes none of them)."""
    names: set[str] = set()
    for g in (graph, *nested_graphs(graph.node)):
        names.update(t.name for t in g.initializer)
        names.update(v.name for v in (*g.input, *g.output, *g.value_info))
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    names.discard("")
    return names
