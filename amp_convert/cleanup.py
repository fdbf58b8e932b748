"""Clean-up passes over the rewritten model.

Each pass is a small class with one job and returns a :class:`PassResult`.
They run on a fresh index of the rewritten graphs.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from .graph import GraphContext, build_context, cast_to, may_nest, node_subgraphs, sort_nodes
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
class PassResult:
    model: onnx.ModelProto
    modified: bool
    count: int = 0  # what the pass removed or changed
    # The nodes it removed, in any graph: the very objects the graphs held
    # (the nodes it keeps stay those objects too), so an index of the model
    # made before the pass finds them by identity, whichever body they were in.
    removed: list[onnx.NodeProto] = field(default_factory=list)


@dataclass
class CleanUp:
    """What the clean-up passes did: a count per pass, and the nodes removed."""

    counts: dict[str, int] = field(default_factory=dict)
    removed: list[onnx.NodeProto] = field(default_factory=list)


def _index(model: onnx.ModelProto, opsets: dict[str, int]) -> GraphContext:
    ctx = build_context(model.graph)
    infer_types(ctx, opsets)
    return ctx


class RemoveRedundantCasts:
    """Bypass Casts that change nothing: ``Cast(x, to=type(x))``, and the
    second Cast of an exact round trip (fp16 -> fp32 -> fp16); then delete
    the bypassed Casts and first halves of pairs that nothing reads any more.
    A lossy pair (fp32 -> fp16 -> fp32) is the model's meaning and stays.
    Casts that write a graph output are kept, so output names never change.

    ``types`` maps tensor names to element types; the rewriter knows them,
    so the pass need not index the model again (it does when not given,
    and then looks each name up in its own graph's scope: sibling bodies
    may each define a tensor of one name, with different types).
    """

    def __init__(self, types: Mapping[str, int] | None = None):
        self.types = types

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        types = self.types
        scopes: dict[int, Mapping[str, int]] | None = None
        if types is None:
            root = _index(model, model_opsets(model))  # (alive while the pass runs: its bodies keep their ids)
            types = root.types
            scopes = {id(ctx.graph): ctx.types for ctx in root.walk() if ctx is not root}
        renames: dict[int, tuple[onnx.GraphProto, dict[str, str]]] = {}  # per graph (by id; the graph held alive)
        candidates: set[str] = set()  # outputs of Casts that may now be unused
        _find_redundant(model.graph, types, {}, renames, candidates, scopes)
        renamed = {name for _, own in renames.values() for name in own}
        if not renamed:
            return PassResult(model, False)
        _apply_renames(model.graph, renames, {})
        candidates |= renamed
        removed: list[onnx.NodeProto] = []
        before = -1
        while len(removed) > before:  # a removed Cast may have been the last reader of the Cast before it
            before = len(removed)
            _remove_unused_casts(model.graph, candidates, set(), removed)
        return PassResult(model, True, len(removed), removed)


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
    candidates: set[str],
    scopes: dict[int, Mapping[str, int]] | None = None,
) -> None:
    """Note in ``renames[id(graph)]`` what each redundant Cast's readers read
    instead (in ``graph`` and, unless they define that name again, its
    bodies). ``scopes``: a body's own types, looked up before its outer ones."""
    casts = dict(outer_casts)  # tensor -> the Cast node writing it
    own: dict[str, str] = {}
    renames[id(graph)] = (graph, own)
    outputs = {v.name for v in graph.output}
    for node in graph.node:
        if node.op_type != "Cast" or not is_default_domain(node.domain):
            for sub in _bodies(node):
                inner = ChainMap(scopes[id(sub)], types) if scopes is not None and id(sub) in scopes else types
                _find_redundant(sub, inner, casts, renames, candidates, scopes)
            continue
        source, out, to = node.input[0], node.output[0], cast_to(node)
        casts[out] = node
        if out in outputs:
            continue
        if types.get(source) == to:
            own[out] = source
            continue
        first = casts.get(source)
        if first is not None:
            origin = first.input[0]
            if types.get(origin) == to and (to, cast_to(first)) in EXACT_WIDENINGS:
                own[out] = origin
                candidates.add(source)


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
    """Run the clean-up passes; returns what each one did, and the nodes they
    removed (for the plan to say so). (``types``: see :class:`RemoveRedundantCasts`.)"""
    done = CleanUp()
    for p in (RemoveRedundantCasts(types),):
        result = p(model)
        done.counts[type(p).__name__] = result.count
        done.removed += result.removed
    return done
