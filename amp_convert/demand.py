"""What consumers need: the element type each node input and graph output
must have under a plan (shared by the planner's backward pass and the
rewriter, so both agree on where Casts go)."""

from __future__ import annotations

from .dtypes import FLOAT, LowDtype
from .graph import GraphContext, cast_to
from .lists import CONVERTED_INPUTS, DTYPE_AGNOSTIC_INPUTS
from .plan import Plan, Precision
from .schema import is_default_domain


class Demand:
    """What consumers need: the element type each node input (and each graph
    output) must have under a plan. Shared by the planner's backward pass and
    the rewriter, so both agree on where Casts go."""

    def __init__(self, plan: Plan, low: LowDtype, io_types: str):
        self.plan = plan
        self.low = low
        self.io_low = io_types == "low"

    def output_type(self, ctx: GraphContext, name: str) -> int:
        """Type a graph output must have: its declared type, low for
        ``--io-types low`` on the main graph, and low for a branch output
        that its If hands on low."""
        declared = ctx.type_of(name)
        if declared != FLOAT:
            return declared
        if ctx.parent is None:
            return self.low.onnx_type if self.io_low else declared
        return self.low.onnx_type if ctx.output_names.index(name) in self.low_output_positions(ctx) else declared

    def low_output_positions(self, body: GraphContext) -> tuple[int, ...]:
        """Positions of a subgraph's outputs that its owner node hands on low."""
        owner = self.plan.entries.get(body.parent.path) if body.parent is not None else None
        if owner is None or body.owner >= len(owner):
            return ()
        entry = owner[body.owner]
        return entry.low_outputs if entry.precision is Precision.LOW and entry.op_type == "If" else ()

    def any_version(self, ctx: GraphContext, j: int) -> bool:
        """Whether node ``j``'s dtype-agnostic input reads a constant's low
        version as it would its fp32 one (see ``CONVERTED_INPUTS``)."""
        return ctx.ops[j] not in CONVERTED_INPUTS or cast_to(ctx.nodes[j]) == self.low.onnx_type

    def requirements(self, ctx: GraphContext, name: str) -> set[int]:
        """Element types that the readers of ``name`` in ``ctx`` (and in the
        subgraphs capturing it) need: the low dtype where a low node reads it
        low, its own type elsewhere; dtype-agnostic reads need nothing. (It
        is asked of constants and of the outputs of nodes resolved from their
        consumers: a Cast to another type than the low dtype needs their
        fp32 values.)"""
        wants: set[int] = set()
        readers = ctx.readers(name)
        if readers:  # (inline, no call per reader: a large graph asks this of every initializer)
            entries, ops, low, own = self.plan.entries[ctx.path], ctx.ops, self.low.onnx_type, None
            for j, slot in readers:
                agnostic = DTYPE_AGNOSTIC_INPUTS.get(ops[j])
                if agnostic is not None and slot in agnostic and is_default_domain(ctx.domains[j]) and self.any_version(ctx, j):
                    continue
                precision, low_inputs, _ = entries.decision(j)
                if precision is Precision.LOW and slot in low_inputs:
                    wants.add(low)
                else:
                    if own is None:
                        own = ctx.type_of(name)
                    wants.add(own)
        for j in ctx.captured_by.get(name, ()):
            for sub in ctx.subgraphs[j]:
                wants |= self.requirements(sub, name)
        if name in ctx.output_names:
            wants.add(self.output_type(ctx, name))
        wants.discard(0)
        return wants
