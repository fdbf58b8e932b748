"""Runs of a model in parts, for models whose weights, or the tensors that
validation exposes, are large against memory (an LLM).

A session of a whole model holds all its weights and, with every float
tensor exposed, every tensor of a run at once: onnxruntime never reuses a
graph output's buffer. Run in parts instead (each a model of its own made
of the nodes that compute some of the wanted tensors, reading the values
earlier parts made), a session holds one part's weights and one part's
exposed tensors, and the values that cross a cut are kept between parts,
per sample. Each part's session is built once and released before the
next part's: the weights are read once, as for one session, and each node
runs once per sample.

Parts are cut in the order the reference computes the wanted tensors; each
is as long as :data:`PART_BYTES` of weights and (as estimated from sizes
known or measured so far) of exposed values allow. Several models (the
reference and the candidate) run part by part together: each part of each
model makes the same wanted tensors, so their values meet one part at a
time.

Only plain graphs are cut (:func:`can_split`): tensors alone cross a cut,
there are no subgraphs and no tensor is a graph output without a node
making it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from .dtypes import FLOAT_TYPES
from .errors import LoadFailure
from .external import is_external, tensor_bytes
from .lists import VALUE_ATTRIBUTE_OPS
from .runner import conform, run, session, value_bytes

# Weights per part, and exposed bytes per part and sample (each at most).
PART_BYTES = 512 << 20
# Wanted tensors of unknown size in a part, before any is measured.
FIRST_PART = 32
# Ops whose values are not tensors (sequences, optionals, maps): a graph holding one is run whole.
_NOT_TENSOR_OPS = frozenset(
    {
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceErase",
        "SequenceAt",
        "SequenceLength",
        "SequenceMap",
        "SplitToSequence",
        "ConcatFromSequence",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "ZipMap",
        "CastMap",
        "DictVectorizer",
    }
)


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the main graph's initializers (external ones included)."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


def can_split(model: onnx.ModelProto) -> bool:
    """Whether ``model`` can run in parts: no node carries a subgraph or
    makes a value that is not a tensor, and each graph output is a node's."""
    graph = model.graph
    made = set()
    for node in graph.node:
        if node.op_type in _NOT_TENSOR_OPS or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            return False
        made.update(node.output)
    return all(v.name in made and v.type.WhichOneof("value") == "tensor_type" for v in graph.output)


def typed_throughout(model: onnx.ModelProto, types: dict[str, int]) -> bool:
    """Whether ``types`` gives every node output of ``model`` an element
    type: a value crossing a cut becomes a graph input of the next part,
    which must declare one (an op type inference does not know leaves its
    outputs untyped: such a model runs whole)."""
    return all(types.get(o) for node in model.graph.node for o in node.output if o)


def worth_splitting(model: onnx.ModelProto, part_bytes: int = PART_BYTES) -> bool:
    """Whether validation runs ``model`` in parts: it can, and its weights pass ``part_bytes``."""
    return weight_bytes(model) > part_bytes and can_split(model)


@dataclass
class PartModel:
    """One model as parts run it: which nodes ran, and what each sample keeps between parts."""

    model: onnx.ModelProto
    types: dict[str, int]  # element type per tensor (a cut's values are graph inputs of the next part)
    provider: str
    base_dir: str | os.PathLike | None = None
    role: str = "candidate"
    disabled_optimizers: Sequence[str] = ()
    inputs: dict[str, np.dtype] = field(default_factory=dict)  # the float graph inputs' dtypes (runner.conform)
    rounded: dict[str, np.dtype] = field(default_factory=dict)  # inputs whose feeds are rounded (emulate.low_inputs)

    def __post_init__(self) -> None:
        graph = self.model.graph
        self.nodes = list(graph.node)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.initializers = {t.name: t for t in graph.initializer}
        self.graph_inputs = {v.name: v for v in graph.input if v.name not in self.initializers}
        self.done = [False] * len(self.nodes)
        self.readers: dict[str, int] = {}  # per value, the nodes left to run that read it
        self.stores: list[dict[str, object]] = []
        self.parts = 0  # built so far
        self.live_sessions = 0  # sessions of this model alive now (one at most)
        self.most_live = 0

    def start(self, samples: Sequence[dict[str, np.ndarray]], wanted: Iterable[str]) -> None:
        """Each sample's feeds, cast and rounded as the whole model would
        read them; the nodes to run are those ``wanted`` needs."""
        self.done = [False] * len(self.nodes)
        needed = self._needed(wanted)
        self.done = [i not in needed for i in range(len(self.nodes))]
        self.readers = {}
        for i, node in enumerate(self.nodes):
            for x in node.input if not self.done[i] else ():
                if x:
                    self.readers[x] = self.readers.get(x, 0) + 1
        self.stores = []
        for feeds in samples:
            fed = conform({k: v for k, v in feeds.items() if k in self.graph_inputs}, self.inputs)
            for name, low in self.rounded.items():
                if name in fed:
                    fed[name] = fed[name].astype(low).astype(np.float32)
            self.stores.append(fed)

    def part(self, wanted: Iterable[str], fetch: Iterable[str]) -> onnx.ModelProto:
        """The model of the nodes not yet run that ``wanted`` needs; it
        outputs those of ``fetch`` it makes and the values later nodes
        read. Its nodes count as run from here on."""
        order = sorted(self._needed(wanted))
        made = {o for i in order for o in self.nodes[i].output if o}
        read = dict.fromkeys(x for i in order for x in self.nodes[i].input if x and x not in made)
        for i in order:
            self.done[i] = True
            for x in self.nodes[i].input:
                if x:
                    self.readers[x] -= 1
        graph = self.model.graph
        inputs = [
            self.graph_inputs[x] if x in self.graph_inputs else helper.make_tensor_value_info(x, self.types[x], None)
            for x in read
            if x not in self.initializers
        ]
        outputs = list(dict.fromkeys([*(w for w in fetch if w in made), *(o for o in made if self.readers.get(o, 0) > 0)]))
        declared = {v.name: v for v in graph.output}
        part = helper.make_graph(
            [self.nodes[i] for i in order],
            f"{graph.name}_part{self.parts}",
            inputs,
            [declared[o] if o in declared else helper.make_tensor_value_info(o, self.types.get(o, 0), None) for o in outputs],
            [self.initializers[x] for x in read if x in self.initializers],
        )
        model = helper.make_model(part, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        model.functions.extend(self.model.functions)
        self.parts += 1
        return model

    def _needed(self, wanted: Iterable[str]) -> set[int]:
        """The nodes not yet run that computing ``wanted`` needs."""
        stack = [self.producer[w] for w in wanted if w in self.producer]
        chosen: set[int] = set()
        while stack:
            i = stack.pop()
            if i in chosen or self.done[i]:
                continue
            chosen.add(i)
            stack.extend(self.producer[x] for x in self.nodes[i].input if x in self.producer)
        return chosen

    def run_part(self, wanted: list[str], fetch: list[str]) -> Callable[[int], dict[str, object]]:
        """A session of the next part (see :meth:`part`); the function it
        returns runs it on a sample (by index) and gives ``fetch``'s values.
        Call :meth:`release` when the part has run on every sample."""
        model = self.part(wanted, fetch)
        self.live_sessions += 1
        self.most_live = max(self.most_live, self.live_sessions)
        if not model.graph.node:  # (what it wants was made already, or is needed by nothing fetched)
            return lambda sample: {}
        try:
            sess = session(model, self.provider, self.base_dir, disabled_optimizers=self.disabled_optimizers)
        except LoadFailure as e:
            raise LoadFailure(e.detail, self.role) from None
        fed = [v.name for v in model.graph.input]

        def on(sample: int) -> dict[str, object]:
            store = self.stores[sample]
            values = run(sess, {x: store[x] for x in fed}, self.role)
            got = {w: values[w] for w in fetch if w in values}
            # Copied: an array onnxruntime returns can hold its session's whole arena alive.
            store.update({o: np.array(v) for o, v in values.items() if self.readers.get(o, 0) > 0})
            for x in [x for x in store if self.readers.get(x, 0) <= 0]:
                del store[x]  # (read by no node left to run)
            return got

        return on

    def release(self) -> None:
        """The part's session is gone (its caller dropped the function :meth:`run_part` gave)."""
        self.live_sessions -= 1


def run_in_parts(
    models: list[PartModel],
    wanted: list[str],
    samples: Sequence[dict[str, np.ndarray]],
    consume: Callable[[int, list[dict[str, object]]], None],
    *,
    order: dict[str, int],
    reach: dict[str, int],
    known: dict[str, int] | None = None,
    part_bytes: int = PART_BYTES,
) -> int:
    """Run ``models`` part by part on every sample, and hand ``consume`` each
    sample's values of each part's wanted tensors, one list per model (the
    first model's order decides: ``order``, its node index per tensor;
    ``reach``: the bytes of weights its nodes up to that one read; both
    from :func:`node_order`).
    ``known``: bytes per sample of some wanted tensors (else estimated from
    the parts run so far). Returns the number of parts."""
    wanted = [w for w in dict.fromkeys(wanted) if w in order]
    for m in models:
        m.start(samples, wanted)
    first = models[0]
    # Cut points: every tensor the first model makes on the way, wanted or not (a part is also bounded
    # by its weights where few tensors are wanted: the outputs alone, without the per-node diff).
    fetched = set(wanted)
    # (in node order, a node's outputs in slot order: the sort is the same on every run)
    route = sorted(
        fetched.union(n for n, i in first.producer.items() if not first.done[i] and n in order),
        key=lambda w: (order[w], _slot(first, w)),
    )
    known = {**inferred_sizes(first.model, samples[0] if samples else {}), **(known or {})}
    # A size no shape tells is taken as the largest measured so far, and at least part_bytes / FIRST_PART:
    # over-estimating costs parts (time), under-estimating memory.
    largest = part_bytes // FIRST_PART
    parts, at, base = 0, 0, 0
    while at < len(route):
        chunk, size = [], 0.0
        while at < len(route):
            name = route[at]
            cost = known.get(name, largest) if name in fetched else 0
            # (never between two outputs of one node: the node runs in one part, which hands on all it makes)
            over = size + cost > part_bytes or reach.get(name, base) - base > part_bytes
            if chunk and over and order[name] != order[chunk[-1]]:
                break
            chunk.append(name)
            size, at = size + cost, at + 1
        base = max(base, reach.get(chunk[-1], base))
        runs = [m.run_part(chunk, [n for n in chunk if n in fetched]) for m in models]
        try:
            for i in range(len(samples)):
                values = [r(i) for r in runs]
                if i == 0:
                    largest = max([largest, *map(value_bytes, values[0].values())])
                consume(i, values)
                del values
        finally:
            del runs
            for m in models:
                m.release()
        parts += 1
    return parts


def _slot(model: PartModel, name: str) -> int:
    """The output slot of ``model``'s node that makes ``name`` (0 where no node does)."""
    i = model.producer.get(name)
    return list(model.nodes[i].output).index(name) if i is not None else 0


def inferred_sizes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes per sample of the tensors whose shape onnx's shape inference
    (with data propagation) fixes, given the shapes of ``feeds``; float
    tensors count 4 bytes an element (as an fp32 or emulated run exposes
    them). Large initializers go to it as dims only."""
    graph = model.graph
    light = onnx.ModelProto()
    light.ir_version, light.producer_name = model.ir_version, model.producer_name
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.node.extend(graph.node)
    g.output.extend(graph.output)
    for t in graph.initializer:
        if is_external(t) or tensor_bytes(t) > 1024:  # (only small ones can be shapes)
            g.initializer.append(onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type))
        else:
            g.initializer.append(t)
    for v in graph.input:
        fixed = g.input.add()
        fixed.CopyFrom(v)
        if v.name in feeds and fixed.type.HasField("tensor_type"):
            shape = fixed.type.tensor_type.shape
            shape.ClearField("dim")
            for d in np.shape(feeds[v.name]):
                shape.dim.add().dim_value = d
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # (onnx's inference raises many types; sizes are then measured as the parts run)
        return {}
    sizes = {}
    for v in inferred.graph.value_info:
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.elem_type and all(d.HasField("dim_value") for d in t.shape.dim):
            item = 4 if t.elem_type in FLOAT_TYPES else np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
            sizes[v.name] = int(np.prod([d.dim_value for d in t.shape.dim], dtype=np.int64)) * item
    return sizes


def node_order(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Each tensor's producing node index in ``model``, and the bytes of
    weights read by the nodes up to that one (for :func:`run_in_parts`)."""
    graph = model.graph
    inits = {t.name: tensor_bytes(t) for t in graph.initializer}
    order, per_node = {}, []
    for i, node in enumerate(graph.node):
        for o in node.output:
            if o:
                order[o] = i
        own = sum(inits.get(x, 0) for x in node.input)
        if node.op_type in VALUE_ATTRIBUTE_OPS:
            own += sum(a.t.ByteSize() for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
        per_node.append(own)
    cumulative = np.cumsum(per_node, dtype=np.int64).tolist()
    return order, {name: cumulative[i] for name, i in order.items()}
