"""Indexes over a model's graphs, built once: producers, consumers (as
asked for), subgraph scopes and the values subgraphs capture from outer
scopes. And the walk over the subgraphs a model nests (the bodies of the
local functions it calls: :mod:`amp_convert.calls`).

Every later stage looks tensors up here instead of scanning the graph, which
keeps the converter linear in the number of nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Set
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from typing import Any

import numpy as np
import onnx

from .errors import AmpError
from .schema import DEFAULT_DOMAINS, is_default_domain

UNTYPED = -2  # the element type given a name a graph's type table does not hold (see GraphContext.input_types)
SUBGRAPH_ATTRIBUTE_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
GRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


@dataclass(eq=False)
class GraphContext:
    """One graph (main graph or subgraph) with its use-def indexes."""

    graph: onnx.GraphProto
    path: str  # "" for the main graph, "node/attr" for subgraphs
    parent: GraphContext | None
    owner: int = -1  # index, in the parent, of the node whose body this is
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    # Plain-list copies of each node's inputs, outputs and op type: reading
    # protobuf fields costs a wrapper per access, and every stage reads them.
    ins: list[list[str]] = field(default_factory=list)
    outs: list[list[str]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    producer: dict[str, int] = field(default_factory=dict)  # tensor -> node index
    captured_by: dict[str, list[int]] = field(default_factory=dict)  # tensor -> nodes whose subgraphs read it
    subgraphs: dict[int, list[GraphContext]] = field(default_factory=dict)  # node index -> its bodies
    free_names: set[str] = field(default_factory=set)  # names read here but defined in an outer scope
    input_names: list[str] = field(default_factory=list)
    input_set: set[str] = field(default_factory=set)
    output_names: list[str] = field(default_factory=list)
    initializers: dict[str, onnx.TensorProto] = field(default_factory=dict)
    types: dict[str, int] = field(default_factory=dict)  # element type per name defined or seen here
    assumed_float: set[str] = field(default_factory=set)  # undeclared outputs of white-listed custom ops
    _input_slots: SlotTable | None = None
    _output_slots: SlotTable | None = None
    _tensors: TensorTable | None = None
    _tensor_types: np.ndarray | None = None
    _input_types: np.ndarray | None = None
    _names: list[str] | None = None
    _labels: NodeLabels | None = None
    _consumers: dict[str, list[tuple[int, int]]] | None = None  # every tensor's readers, once asked for

    def defines(self, name: str) -> bool:
        return name in self.producer or name in self.initializers or name in self.input_set

    def scope_of(self, name: str) -> GraphContext | None:
        """The innermost graph (this or an ancestor) that defines ``name``."""
        ctx: GraphContext | None = self
        while ctx is not None:
            if ctx.defines(name):
                return ctx
            ctx = ctx.parent
        return None

    def type_of(self, name: str) -> int:
        """Element type of ``name`` as seen from this graph (0 if unknown)."""
        ctx: GraphContext | None = self
        while ctx is not None:
            t = ctx.types.get(name)
            if t is not None:
                return t
            if ctx.defines(name):
                return 0
            ctx = ctx.parent
        return 0

    @property
    def consumers(self) -> dict[str, list[tuple[int, int]]]:
        """Tensor -> the (node, slot) pairs reading it in this graph, in graph
        order: every tensor's, made on first use."""
        if self._consumers is None:
            self._consumers = _readers(self.input_slots())
        return self._consumers

    def readers(self, name: str) -> list[tuple[int, int]]:
        """The (node, slot) pairs reading ``name`` in this graph, in graph order."""
        return self.consumers.get(name, [])

    def node_names(self) -> list[str]:
        """Every node's name (read on first use: the planner is the one
        stage that needs them all). Not checked for UTF-8 here."""
        if self._names is None:
            self._names = [node.name for node in self.nodes]
        return self._names

    def input_slots(self) -> SlotTable:
        """Every node's input slots in one table (made on first use: the
        planner and the rewriter both look at all of them)."""
        if self._input_slots is None:
            self._input_slots = slot_table(self.ins)
        return self._input_slots

    def input_types(self) -> np.ndarray:
        """Each input slot's element type in this graph's type table
        (UNTYPED where it holds none), looked up once for the planner and
        the rewriter: asked for once the types are inferred. Read-only."""
        if self._input_types is None:
            self._input_types = self.tensors().over_slots(self.tensor_types(), self._slot_type)
            self._input_types.flags.writeable = False
        return self._input_types

    def _slot_type(self, name: str) -> int:
        return self.types.get(name, UNTYPED)

    def tensor_types(self) -> np.ndarray:
        """Each tensor's element type (see :meth:`tensors`) in this graph's
        type table, UNTYPED where it holds none: asked for once the types
        are inferred. Read-only."""
        if self._tensor_types is None:
            names = self.tensors().names
            self._tensor_types = np.fromiter(map(self.types.get, names, repeat(UNTYPED)), np.int64, len(names))
            self._tensor_types.flags.writeable = False
        return self._tensor_types

    def tensors(self) -> TensorTable:
        """The graph's tensors, numbered, and the number each input slot
        reads (made on first use)."""
        if self._tensors is None:
            self._tensors = tensor_table(self)
        return self._tensors

    def output_slots(self) -> SlotTable:
        """Every node's output slots in one table (made on first use)."""
        if self._output_slots is None:
            self._output_slots = slot_table(self.outs)
        return self._output_slots

    def node_label(self, index: int) -> str:
        """Node ``index``'s label (see :class:`NodeLabels`)."""
        if self._labels is None:
            self._labels = NodeLabels(self.node_names(), self.ops)
        return self._labels[index]

    def walk(self) -> Iterator[GraphContext]:
        """This graph and all nested subgraphs, outer before inner."""
        yield self
        for subs in self.subgraphs.values():
            for sub in subs:
                yield from sub.walk()


@dataclass(frozen=True)
class SlotTable:
    """The input (or output) slots of a graph's nodes, flattened in node
    order: each slot's tensor name, node and position. Array operations over
    all slots at once replace a Python loop per node on large graphs."""

    names: list[str]
    node: np.ndarray
    slot: np.ndarray
    counts: np.ndarray  # slots per node

    def starts(self) -> np.ndarray:
        """Per node, the position of its first slot."""
        return np.cumsum(self.counts) - self.counts


@dataclass(frozen=True)
class TensorTable:
    """The tensors a graph holds, numbered: its nodes' outputs (in output
    slot order), its initializers, its inputs; and the number of the tensor
    each input slot reads (-1 for a name the graph does not hold: an absent
    input, an outer value). A question about the names the slots read is
    then asked once per tensor, not once per slot (a tensor is read about
    twice), and a question about a few names costs a few lookups."""

    names: list[str]  # by number (a name held twice is at two numbers: slots read its last)
    number: dict[str, int]  # name -> its (last) number
    of_slot: np.ndarray  # input slot -> number of its tensor, or -1
    slot_names: list[str]  # (the input slots' names, as SlotTable.names)

    def over_slots(self, per_tensor: np.ndarray, ask: Callable[[str], object]) -> np.ndarray:
        """A value per input slot: its tensor's in ``per_tensor``, or
        ``ask(name)`` for a name the graph does not hold."""
        spread = np.append(per_tensor, per_tensor.dtype.type(0))[self.of_slot]  # (-1: the padding, replaced below)
        unheld = np.flatnonzero(self.of_slot < 0)
        if unheld.size:
            names = self.slot_names
            spread[unheld] = [ask(names[k]) for k in unheld.tolist()]
        return spread

    def slots_in(self, names: Collection[str]) -> np.ndarray:
        """Per input slot: whether its name is one of ``names`` (a lookup per name)."""
        marked = np.zeros(len(self.names) + 1, bool)  # (the last for names not held: -1)
        marked[np.fromiter(map(self.number.get, names, repeat(-1)), np.int64)] = True
        return self.over_slots(marked[:-1], names.__contains__)


def tensor_table(ctx: GraphContext) -> TensorTable:
    names = [*ctx.output_slots().names, *ctx.initializers, *ctx.input_names]
    number = dict(zip(names, range(len(names)), strict=True))
    number.pop("", None)  # (an absent output: nothing reads it)
    slot_names = ctx.input_slots().names
    of_slot = np.fromiter(map(number.get, slot_names, repeat(-1)), np.int64, len(slot_names))
    return TensorTable(names, number, of_slot, slot_names)


def slot_table(columns: list[list[str]]) -> SlotTable:
    names = list(chain.from_iterable(columns))
    counts = np.fromiter(map(len, columns), np.int64, len(columns))
    node = np.repeat(np.arange(len(columns)), counts)
    starts = np.cumsum(counts) - counts
    return SlotTable(names, node, np.arange(len(names)) - np.repeat(starts, counts), counts)


class NodeLabels:
    """How plans, reports and name rules call a graph's nodes: a node's name,
    or, for an unnamed one, ``OpType_index``, with ``#`` appended while a
    node of the graph is named so (a rule naming one must not select both)."""

    def __init__(self, names: list[str], ops: list[str]) -> None:
        self._names, self._ops = names, ops
        self._taken: set[str] | None = None  # (the names, gathered for the first unnamed node)

    def __getitem__(self, index: int) -> str:
        name = self._names[index]
        if name:
            return name
        label = f"{self._ops[index]}_{index}"
        if self._taken is None:
            self._taken = set(self._names)
        while label in self._taken:
            label += "#"
        return label


def check_utf8(names: Iterable) -> None:
    """ONNX names are UTF-8; protobuf hands invalid ones back as bytes, which
    no later stage can handle: refused with the first of them."""
    try:
        "".join(names)  # (a loop in C that refuses anything but str: a third of the time of collecting the types)
    except TypeError:
        raise not_utf8(next(n for n in names if type(n) is not str)) from None


def not_utf8(name: object) -> AmpError:
    return AmpError(f"the model holds the name {name!r}, which is not valid UTF-8 (a corrupt file?)")


def cast_to(node: onnx.NodeProto) -> int:
    """The element type a Cast node converts to (0 if it says none)."""
    for a in node.attribute:
        if a.name == "to":
            return a.i
    return 0


def attribute_int(node: onnx.NodeProto, name: str, default: int) -> int:
    """The value of ``node``'s integer attribute ``name``, or ``default`` where it has none."""
    for a in node.attribute:
        if a.name == name and a.type == onnx.AttributeProto.INT:
            return a.i
    return default


def node_subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    return attribute_subgraphs(node.attribute)


def attribute_subgraphs(attributes: Iterable[onnx.AttributeProto]) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graphs ``attributes`` hold, each named by its attribute (and position)."""
    for attr in attributes:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", g


def nested_graphs(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.GraphProto]:
    """The graphs nested in ``nodes``' attributes, at any depth, each before
    those nested in it (in nodes the checker passed: see :func:`may_nest`)."""
    for node in nodes:
        if not may_nest(node):
            continue
        for _, graph in node_subgraphs(node):
            yield graph
            yield from nested_graphs(graph.node)


def may_nest(node: onnx.NodeProto) -> bool:
    """Whether another graph may be reached from ``node``: a subgraph it
    holds (only GRAPH_OPS and custom-domain ops, such as BeamSearch, hold
    any) or the body of a local function it calls (a call is of a custom
    domain: onnx's checker and onnxruntime refuse one of the default
    domain). Walks read no other node further."""
    return node.op_type in GRAPH_OPS or not is_default_domain(node.domain)


def build_context(
    graph: onnx.GraphProto,
    path: str = "",
    parent: GraphContext | None = None,
    owner: int = -1,
) -> GraphContext:
    """Index ``graph`` and, recursively, its subgraphs."""
    ctx = GraphContext(graph=graph, path=path, parent=parent, owner=owner)
    ctx.nodes = list(graph.node)
    ctx.input_names = [v.name for v in graph.input]
    ctx.input_set = set(ctx.input_names)
    ctx.output_names = [v.name for v in graph.output]
    ctx.initializers = graph_initializers(graph)
    nodes = ctx.nodes
    # Column by column: each protobuf field is read once, in one comprehension.
    ctx.ins = [node.input[:] for node in nodes]
    ctx.outs = [node.output[:] for node in nodes]
    ctx.ops, ctx.domains = [node.op_type for node in nodes], [node.domain for node in nodes]
    ops, domains = ctx.ops, ctx.domains
    outputs = ctx.output_slots()  # (a later name wins, as it would in a loop over the nodes)
    ctx.producer = producer = dict(zip(outputs.names, outputs.node.tolist(), strict=True))
    # Only these default-domain ops carry graphs; other domains may (e.g. BeamSearch).
    containers = (
        [
            i
            for i, (op, domain) in enumerate(zip(ops, domains, strict=True))
            if op in GRAPH_OPS or (domain not in DEFAULT_DOMAINS and len(nodes[i].attribute))
        ]
        if not (GRAPH_OPS.isdisjoint(ops) and set(domains).issubset(DEFAULT_DOMAINS))  # (most graphs: none, found in C)
        else []
    )
    producer.pop("", None)
    _check_utf8(ctx, (ops, domains))
    labels: set[str] = set()
    for i in containers:
        node = ctx.nodes[i]
        if not any(a.type in SUBGRAPH_ATTRIBUTE_TYPES for a in node.attribute):
            continue
        label = ctx.node_label(i)
        while label in labels:  # (two nodes of one name: each body needs a path of its own)
            label = f"{label}#{i}"
        labels.add(label)
        subs = []
        for attr_name, g in node_subgraphs(node):
            sub = build_context(g, f"{path}/{label}/{attr_name}" if path else f"{label}/{attr_name}", ctx, i)
            subs.append(sub)
            for name in sub.free_names:
                ctx.captured_by.setdefault(name, []).append(i)
        ctx.subgraphs[i] = subs
    # Free names: read here (directly or by nested subgraphs) but defined outside.
    if parent is not None:  # (the main graph reads nothing from outside)
        read = set(ctx.input_slots().names).union(ctx.captured_by)
        ctx.free_names = read.difference(producer, ctx.initializers, ctx.input_set, ("",))  # ("": an absent input)
    return ctx


def graph_initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """A graph's initializers by name, with the values of its sparse ones."""
    initializers = {t.name: t for t in graph.initializer}
    for t in graph.sparse_initializer:
        initializers.setdefault(t.values.name, t.values)
    return initializers


def _readers(table: SlotTable) -> dict[str, list[tuple[int, int]]]:
    """Tensor -> the (node, slot) pairs reading it, in graph order. (Over the
    slot table's columns: no loop of Python's own per node and slot.)"""
    readers: dict[str, list[tuple[int, int]]] = {}
    get = readers.get
    for name, pair in zip(table.names, zip(table.node.tolist(), table.slot.tolist(), strict=True), strict=True):
        found = get(name)
        if found is None:
            readers[name] = [pair]
        else:
            found.append(pair)
    readers.pop("", None)  # (an absent optional input)
    return readers


def _check_utf8(ctx: GraphContext, columns: Iterable[list]) -> None:
    """:func:`check_utf8` over the index's names and the node ``columns``
    read from the proto (one pass over the index, not the proto; node names
    are the planner's, which reads them)."""
    for names in (ctx.producer, ctx.input_slots().names, ctx.input_names, ctx.output_names, ctx.initializers, *columns):
        check_utf8(names)


def tensor_names(root: GraphContext) -> set[str]:
    """Every tensor name of the indexed model, subgraphs included (to keep new names unique)."""
    names: set[str] = set()
    for ctx in root.walk():
        names.update(ctx.producer)
        names.update(ctx.input_slots().names)  # (with "", an absent input's: no new name is empty)
        names.update(ctx.input_names)
        names.update(ctx.output_names)
        names.update(ctx.initializers)
    return names


def names_repeat_across_graphs(root: GraphContext) -> bool:
    """Whether two graphs of the indexed model define a tensor of one name
    (sibling bodies may: ONNX forbids only a body redefining an outer name).
    A table of every graph's types by name alone would then mix them up."""
    graphs = list(root.walk())
    if len(graphs) == 1:
        return False
    seen: set[str] = set()
    for ctx in graphs:
        defined = {*ctx.producer, *ctx.initializers, *ctx.input_names}
        if not seen.isdisjoint(defined):
            return True
        seen |= defined
    return False


def name_in_use(root: GraphContext) -> NamesInUse:
    """Whether a name is taken in the indexed model, subgraphs included: a
    tensor a graph defines (node output, initializer, input) or lists as an
    output, or a node's name. New tensors and new nodes take names none of
    these hold (onnxruntime refuses two nodes of one name). What the nodes
    of a valid model read is among the tensors (the input checker refuses a
    name read and never defined), so a name not in use here is as new as by
    :func:`tensor_names`, whose set of every name costs a pass over every
    input slot; this asks a few dicts per name."""
    return NamesInUse(
        [
            (ctx.producer, ctx.initializers, ctx.input_set, frozenset(ctx.output_names), frozenset(ctx.node_names()))
            for ctx in root.walk()
        ]
    )


class NamesInUse:
    """The names an indexed model holds, per graph a few dicts and sets (see
    :func:`name_in_use`), asked one name at a time."""

    def __init__(self, holders: list[tuple[dict[str, Any] | Set[str], ...]]) -> None:
        self._holders = [names for graph in holders for names in graph]

    def __call__(self, name: str) -> bool:
        return any(name in names for names in self._holders)


def sort_nodes(container: Any, keys: list) -> None:
    """Sort a graph's node list (a protobuf repeated field) in place by
    ``keys``, one per node in list order (stable): the nodes are moved, not
    copied. The container sorts a list of its nodes, each node's key asked
    for once and in list order (CPython's list.sort): the keys are handed
    out by a C callable, ``next(keys, node)``, not a Python function per node."""
    container.sort(key=partial(next, iter(keys)))


class NameGenerator:
    """Deterministic unique names: ``base`` if free, else ``base_1``, ``base_2`` ...
    ``in_use``: whether a name is the model's (see :func:`name_in_use`)."""

    def __init__(self, in_use: Callable[[str], bool]):
        self._made: set[str] = set()
        self._in_use = in_use

    def __call__(self, base: str) -> str:
        name, i = base, 0
        while name in self._made or self._in_use(name):
            i += 1
            name = f"{base}_{i}"
        self._made.add(name)
        return name

    @property
    def made(self) -> Set[str]:
        """The names it has made."""
        return self._made
