"""Clean-up passes over the rewritten model: Casts that change nothing,
exact Cast round trips, and the Casts those leave unread.

Each pass is a small class with one job, its rules in its docstring, and
returns a :class:`~amp_convert.passes.PassResult` (as onnx-ir's passes do);
:func:`clean_up` runs them in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from .graph import GraphContext, build_context, cast_to, may_nest, node_subgraphs, sort_nodes
from .passes import PassResult
from .schema import is_default_domain, model_opsets
from .typeinfo import infer_types

# from -> to conversions that lose nothing, so casting back recovers the input exactly
EXACT_WIDENINGS = frozenset(
    {
        (TensorProto.FLOAT16, TensorProto.FLOAT),
        (TensorProto.BFLOAT16, TensorProto.FLOAT),
        (TensorProto.FLOAT16, TensorProto.DOUBLE),
        (TensorProto.BFLOAT16, TensorProto.DOUBLE),
        (TensorProto.FLOAT, TensorProto.DOUBLE),
    }
)


@dataclass
class CleanUp:
    """What the clean-up passes did: a count per pass (:attr:`PassResult.count`), and the nodes removed."""

    counts: dict[str, int] = field(default_factory=dict)
    removed: list[onnx.NodeProto] = field(default_factory=list)


def _index(model: onnx.ModelProto, opsets: dict[str, int]) -> GraphContext:
    ctx = build_context(model.graph)
    infer_types(ctx, opsets)
    return ctx


# A rule: for a Cast, its element types and the Casts that write the tensors in
# scope, the tensor its readers may read instead and the Cast before it that
# may then be unused (None: the rule does not bypass it).
Bypass = tuple[str, str | None] | None
Redirect = Callable[[onnx.NodeProto, Mapping[str, int], Mapping[str, onnx.NodeProto]], Bypass]


class _BypassCasts(ABC):
    """A pass that points the readers of the Casts its rule picks at the
    tensor they stand for, in the Cast's graph and the bodies within (unless
    they define that name again). The bypassed Casts stay, unread, for
    :class:`RemoveUnusedCasts` (their names: :attr:`PassResult.bypassed`,
    with the Casts before them the rule names). A Cast that writes a graph
    output is never bypassed, so output names never change.

    ``types`` maps tensor names to element types; the rewriter knows them,
    so the pass need not index the model again (it does when not given,
    and then looks each name up in its own graph's scope: sibling bodies
    may each define a tensor of one name, with different types).
    """

    def __init__(self, types: Mapping[str, int] | None = None):
        self.types = types

    @staticmethod
    @abstractmethod
    def redirect(node: onnx.NodeProto, types: Mapping[str, int], casts: Mapping[str, onnx.NodeProto]) -> Bypass:
        """The pass's rule (see :data:`Redirect`)."""

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        types = self.types
        scopes: dict[int, Mapping[str, int]] | None = None
        if types is None:
            root = _index(model, model_opsets(model))  # (alive while the pass runs: its bodies keep their ids)
            types = root.types
            scopes = {id(ctx.graph): ctx.types for ctx in root.walk() if ctx is not root}
        renames: dict[int, tuple[onnx.GraphProto, dict[str, str]]] = {}  # per graph (by id; the graph held alive)
        before: set[str] = set()  # outputs of the Casts before bypassed ones, which may now be unused
        _find_redundant(model.graph, types, {}, renames, before, scopes, self.redirect)
        count = sum(len(own) for _, own in renames.values())
        if not count:
            return PassResult(model, False)
        _apply_renames(model.graph, renames, {})
        bypassed = {name for _, own in renames.values() for name in own}
        return PassResult(model, True, count, bypassed=bypassed | before)


class RemoveIdentityCasts(_BypassCasts):
    """Bypass the Casts that change nothing.

    Rules:

    * ``Cast(x, to=type(x))``: its readers read ``x``;
    * a Cast that writes a graph output stays read (output names never change).
    """

    @staticmethod
    def redirect(node: onnx.NodeProto, types: Mapping[str, int], casts: Mapping[str, onnx.NodeProto]) -> Bypass:
        source = node.input[0]
        return (source, None) if types.get(source) == cast_to(node) else None


class FoldCastRoundTrips(_BypassCasts):
    """Bypass the second Cast of an exact round trip.

    Rules:

    * ``Cast(Cast(x, to=wide), to=type(x))`` where ``type(x) -> wide`` loses
      nothing (EXACT_WIDENINGS: fp16 -> fp32, ...): its readers read ``x``,
      and the first Cast may then be unused;
    * a lossy pair (fp32 -> fp16 -> fp32) is the model's meaning and stays;
    * a Cast that changes nothing is :class:`RemoveIdentityCasts`'s, not a round trip;
    * a Cast that writes a graph output stays read (output names never change).
    """

    @staticmethod
    def redirect(node: onnx.NodeProto, types: Mapping[str, int], casts: Mapping[str, onnx.NodeProto]) -> Bypass:
        source, to = node.input[0], cast_to(node)
        first = casts.get(source)
        if types.get(source) == to or first is None:
            return None
        origin = first.input[0]
        if types.get(origin) == to and (to, cast_to(first)) in EXACT_WIDENINGS:
            return origin, source
        return None


class RemoveUnusedCasts:
    """Delete the Casts of ``candidates`` (their output names: what the
    bypassing passes left unread) that nothing reads, in any graph.

    Rules:

    * a candidate Cast whose output no node, body or graph output reads is deleted;
    * deleting one may leave the Cast before it unread: deleted in turn, if a candidate;
    * every other node stays, and stays the object it was.
    """

    def __init__(self, candidates: set[str]):
        self.candidates = candidates

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        if not self.candidates:
            return PassResult(model, False)
        removed: list[onnx.NodeProto] = []
        before = -1
        while len(removed) > before:  # a removed Cast may have been the last reader of the Cast before it
            before = len(removed)
            _remove_unused_casts(model.graph, self.candidates, set(), removed)
        return PassResult(model, bool(removed), len(removed), removed)


def indexed_casts(root: GraphContext) -> list[tuple[GraphContext, int]]:
    """Where the ONNX Cast nodes of the indexed graphs are (graph, node
    index), as :func:`count_casts` counts them: what the plan says of them
    is found from there."""
    return [(c, i) for c in root.walk() for i, op in enumerate(c.ops) if op == "Cast" and is_default_domain(c.domains[i])]


def _find_redundant(
    graph: onnx.GraphProto,
    types: Mapping[str, int],
    outer_casts: dict[str, onnx.NodeProto],
    renames: dict[int, tuple[onnx.GraphProto, dict[str, str]]],
    before: set[str],
    scopes: dict[int, Mapping[str, int]] | None,
    redirect: Redirect,
) -> None:
    """Note in ``renames[id(graph)]`` what the readers of each Cast that
    ``redirect`` bypasses read instead (in ``graph`` and, unless they define
    that name again, its bodies), and in ``before`` the Casts before them it
    names. ``scopes``: a body's own types, looked up before its outer ones."""
    casts = dict(outer_casts)  # tensor -> the Cast node writing it
    own: dict[str, str] = {}
    renames[id(graph)] = (graph, own)
    outputs = {v.name for v in graph.output}
    for node in graph.node:
        if node.op_type != "Cast" or not is_default_domain(node.domain):
            for sub in _bodies(node):
                inner = ChainMap(scopes[id(sub)], types) if scopes is not None and id(sub) in scopes else types
                _find_redundant(sub, inner, casts, renames, before, scopes, redirect)
            continue
        out = node.output[0]
        casts[out] = node
        if out in outputs:
            continue
        found = redirect(node, types, casts)
        if found is not None:
            own[out], first = found
            if first is not None:
                before.add(first)


def _resolve(name: str, renames: Mapping[str, str]) -> str:
    seen = 0
    while name in renames and seen < 64:
        name, seen = renames[name], seen + 1
    return name


def _apply_renames(
    graph: onnx.GraphProto, renames: dict[int, tuple[onnx.GraphProto, dict[str, str]]], outer: Mapping[str, str]
) -> None:
    """Apply the renames noted for ``graph`` and those of the graphs around it (``outer``)."""
    own = renames[id(graph)][1] if id(graph) in renames else {}
    here = ChainMap(own, outer) if outer else own
    for node in graph.node:
        for slot, name in enumerate(node.input):
            if name in here:
                node.input[slot] = _resolve(name, here)
        for sub in _bodies(node):
            _apply_renames(sub, renames, here)


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """Subgraphs of a node (see :func:`may_nest`)."""
    if may_nest(node):
        return [g for _, g in node_subgraphs(node)]
    return []


def _used_names(graph: onnx.GraphProto, into: set[str]) -> set[str]:
    for node in graph.node:
        into.update(node.input)
        for sub in _bodies(node):
            _used_names(sub, into)
    into.update(v.name for v in graph.output)
    return into


def _remove_unused_casts(
    graph: onnx.GraphProto, candidates: set[str], outer_used: set[str], removed: list[onnx.NodeProto]
) -> None:
    """Delete the Casts of ``candidates`` that nothing reads, here and in the
    bodies within; append them to ``removed``."""
    used = _used_names(graph, set(outer_used))
    for node in graph.node:
        for sub in _bodies(node):
            _remove_unused_casts(sub, candidates, used, removed)
    doomed = [
        k for k, n in enumerate(graph.node) if n.op_type == "Cast" and n.output[0] in candidates and n.output[0] not in used
    ]
    if doomed:
        removed.extend(map(graph.node.__getitem__, doomed))
        _delete_nodes(graph, doomed)


# Up to this many nodes are deleted one by one (each delete shifts the list);
# more are sorted to the end and deleted at once.
_DELETE_AT_MOST = 256


def _delete_nodes(graph: onnx.GraphProto, positions: list[int]) -> None:
    """Delete the nodes at ``positions`` (ascending) in place: the others
    keep their order and stay the objects they were (writing the list anew
    would copy every node, and leave indexes of the model pointing at the
    old ones)."""
    container = graph.node
    if len(positions) <= _DELETE_AT_MOST:
        for k in reversed(positions):
            del container[k]
        return
    gone = set(positions)
    sort_nodes(container, [k in gone for k in range(len(container))])
    del container[len(container) - len(positions) :]


def _count_casts(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        if node.op_type == "Cast" and is_default_domain(node.domain):
            n += 1
        else:
            n += sum(_count_casts(sub) for sub in _bodies(node))
    return n


def count_casts(model: onnx.ModelProto) -> int:
    """ONNX Cast nodes in the model, subgraphs included (a custom domain's
    op of that name is not one)."""
    return _count_casts(model.graph)


def clean_up(model: onnx.ModelProto, types: Mapping[str, int] | None = None) -> CleanUp:
    """Run the clean-up passes in order: the two that bypass Casts, then the
    one that deletes the Casts they left unread. Returns what each one did
    (by class name), and the nodes removed (for the plan to say so).
    (``types``: see :class:`RemoveIdentityCasts`.)"""
    done = CleanUp()
    bypassed: set[str] = set()
    # (round trips first: each rule then sees the Casts as the rewrite left them)
    for bypass in (FoldCastRoundTrips(types), RemoveIdentityCasts(types)):
        result = bypass(model)
        done.counts[type(bypass).__name__] = result.count
        bypassed |= result.bypassed
    result = RemoveUnusedCasts(bypassed)(model)
    done.counts[RemoveUnusedCasts.__name__] = result.count
    done.removed = result.removed
    return done
