"""Local-function calls: the walk over the bodies a model's nodes call,
at any depth through subgraphs and other calls, with the attributes each
call binds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import onnx

from .graph import attribute_subgraphs, may_nest

CallKey = tuple[str, str, str]  # (domain, name, overload): what a call names a local function by


def call_key(node: onnx.NodeProto) -> CallKey:
    """The local function ``node`` calls, if it calls one (see :func:`local_functions`)."""
    return node.domain, node.op_type, node.overload


def local_functions(functions: Iterable[onnx.FunctionProto]) -> dict[CallKey, onnx.FunctionProto]:
    """A model's local functions by the key their calls name them with (see :func:`call_key`)."""
    return {(f.domain, f.name, f.overload): f for f in functions}


@dataclass(frozen=True, eq=False)
class Subgraph:
    """Where a subgraph's nodes are: in attribute ``attribute`` of node
    ``index`` of ``nodes``, which are ``within`` (see :class:`Call`)."""

    nodes: Sequence[onnx.NodeProto]
    index: int
    attribute: str
    within: Subgraph | Call | None


@dataclass(frozen=True, eq=False)
class Call:
    """A call of a local function, as a walk over a model finds it (see
    :func:`reached_calls`): node ``index`` of ``nodes`` calls ``function``.
    ``within``: where those nodes are, in a subgraph, in the body another
    call calls (that call), or (None) in the main graph."""

    nodes: Sequence[onnx.NodeProto]
    index: int
    function: onnx.FunctionProto
    within: Subgraph | Call | None

    @property
    def node(self) -> onnx.NodeProto:
        return self.nodes[self.index]

    @property
    def caller(self) -> Call | None:
        """The call whose body this call is in (None: a call of the main graph or of its subgraphs)."""
        within = self.within
        while isinstance(within, Subgraph):
            within = within.within
        return within

    @cached_property
    def bound(self) -> dict[str, onnx.AttributeProto]:
        """The function's attributes by name, as this call binds them: the
        node's own (in a body, as its call binds those they refer to: see
        :func:`bind`), else the function's defaults. What the body computes
        may depend on them (a Cast to the type an attribute names)."""
        caller = self.caller
        given = self.node.attribute if caller is None else bind(self.node.attribute, caller.bound)
        bound = {a.name: a for a in self.function.attribute_proto}  # (defaults)
        bound.update((a.name, a) for a in given)
        return bound


def bind(attributes: Iterable[onnx.AttributeProto], bound: Mapping[str, onnx.AttributeProto]) -> Iterator[onnx.AttributeProto]:
    """A body node's attributes with those that refer to the function's
    (``ref_attr_name``) given the value the call binds (left out where it
    binds none)."""
    for a in attributes:
        if not a.ref_attr_name:
            yield a
        elif a.ref_attr_name in bound:
            value = onnx.AttributeProto()
            value.CopyFrom(bound[a.ref_attr_name])
            value.name = a.name
            yield value


def reached_calls(graph: onnx.GraphProto, functions: Mapping[CallKey, onnx.FunctionProto]) -> Iterator[Call]:
    """Every call of a local function a model makes, as onnxruntime reaches
    them: from its main graph ``graph`` (its subgraphs too), and from the
    bodies of the functions called, each body read once, as written (a
    function nothing calls is not read: onnxruntime loads a model whose
    uncalled function holds anything). A model's main graph first, then the
    bodies, each in node order, a node's subgraphs right after it."""
    return (call for call, _ in _walk(graph, functions, per_binding=False))


def called_bodies(graph: onnx.GraphProto, functions: Mapping[CallKey, onnx.FunctionProto]) -> Iterator[Call]:
    """The calls from which a walk as :func:`reached_calls`' reads the body
    called, each body once per binding of its attributes (:attr:`Call.bound`)
    and as that binds them, subgraphs given as attributes too: as a call
    binds them, a body may compute another type, or call another function."""
    return (call for call, enters in _walk(graph, functions, per_binding=True) if enters)


def _walk(
    graph: onnx.GraphProto, functions: Mapping[CallKey, onnx.FunctionProto], per_binding: bool
) -> Iterator[tuple[Call, bool]]:
    """Each call the walk finds, and whether it reads the body called from
    there: the first call of its function or, ``per_binding``, of its
    binding (see :func:`called_bodies`)."""
    entered: set[tuple] = set()
    bodies: list[Call | None] = [None]  # (None: the main graph)
    while bodies:
        caller = bodies.pop()
        if caller is None:
            calls = _calls(graph.node, functions, None, None)
        else:
            calls = _calls(caller.function.node, functions, caller, caller.bound if per_binding else None)
        for call in calls:
            key = _binding_key(call) if per_binding else call_key(call.node)
            enters = key not in entered
            if enters:
                entered.add(key)
                bodies.append(call)
            yield call, enters


def _calls(
    nodes: Sequence[onnx.NodeProto],
    functions: Mapping[CallKey, onnx.FunctionProto],
    within: Subgraph | Call | None,
    bound: Mapping[str, onnx.AttributeProto] | None,
) -> Iterator[Call]:
    """The calls of local functions that ``nodes`` (and their subgraphs)
    make; ``bound``: the binding of the body they are in, where it is read
    as bound (a subgraph an attribute refers to is then the one given)."""
    for i in [i for i, node in enumerate(nodes) if may_nest(node)]:
        node = nodes[i]
        function = functions.get(call_key(node))
        if function is not None:
            yield Call(nodes, i, function, within)
        attributes = node.attribute if bound is None else bind(node.attribute, bound)
        for name, graph in attribute_subgraphs(attributes):
            yield from _calls(graph.node, functions, Subgraph(nodes, i, name, within), bound)


def _binding_key(call: Call) -> tuple:
    """A call's function and, serialized, the attributes it binds."""
    return (*call_key(call.node), *sorted(a.SerializeToString(deterministic=True) for a in call.bound.values()))
