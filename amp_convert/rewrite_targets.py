"""Which nodes the rewrite must look at: those reading a tensor in a type
it may no longer have, control flow, low ops whose attributes change, and
the graph outputs' producers and readers. Most nodes of a large graph read
what they need as it is; one lookup per input and a few array operations
find the others (conservatively: what the arrays cannot settle is looked at).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import is_not

import numpy as np

from .dtypes import FLOAT
from .graph import UNTYPED, GraphContext
from .lists import DTYPE_AGNOSTIC_INPUTS, DTYPE_ATTRIBUTE_OPS, PASS_THROUGH_ATTRIBUTES, VALUE_ATTRIBUTE_OPS
from .plan import Precision

# Ops whose attributes fix their output type, or hold a value they pass on:
# rewritten when they run low.
REWRITTEN_OPS = frozenset(DTYPE_ATTRIBUTE_OPS) | VALUE_ATTRIBUTE_OPS | PASS_THROUGH_ATTRIBUTES.keys()
_LOW, _UNCHANGED = Precision.LOW, Precision.UNCHANGED
_RETYPED = -3  # (a float32 tensor the rewrite made low)
_MASK_SLOTS = 62  # input slots a bit mask holds; a later slot is always looked at
_AGNOSTIC_MASKS = {op: sum(1 << s for s in slots) for op, slots in DTYPE_AGNOSTIC_INPUTS.items()}


class _SlotMasks(dict):
    """Slot tuple -> bit mask (made on first use: a graph repeats a few)."""

    def __missing__(self, slots: tuple[int, ...]) -> int:
        mask = self[slots] = sum(1 << s for s in slots if s < _MASK_SLOTS)
        return mask


@dataclass
class SlotReads:
    """For every input slot of a graph (its :meth:`GraphContext.input_slots`
    order): whether its node reads it low under the plan, and whether the
    read is dtype-agnostic (by op, as the rewrite's loop skips it). Slots past
    ``_MASK_SLOTS`` are ``odd``: the masks cannot say; they are looked at
    one by one."""

    low: np.ndarray
    agnostic: np.ndarray
    odd: np.ndarray


def constant_writes(ctx: GraphContext, name: str) -> bool:
    """Whether a constant-making node of ``ctx`` writes ``name``."""
    i = ctx.producer.get(name)
    return i is not None and ctx.ops[i] in VALUE_ATTRIBUTE_OPS


def slot_reads(ctx: GraphContext, low_inputs: list[tuple[int, ...]]) -> SlotReads:
    """``low_inputs``: each node's low input slots (empty unless it runs low)."""
    table = ctx.input_slots()
    node, slot, n = table.node, table.slot, len(ctx.ins)
    masks = _SlotMasks()
    low_masks = np.fromiter(map(masks.__getitem__, low_inputs), np.int64, n)
    agnostic_masks = np.fromiter(map(_AGNOSTIC_MASKS.get, ctx.ops, repeat(0)), np.int64, n)
    bit = np.left_shift(1, np.minimum(slot, _MASK_SLOTS))
    return SlotReads((low_masks[node] & bit) != 0, (agnostic_masks[node] & bit) != 0, slot >= _MASK_SLOTS)


def nodes_to_visit(
    ctx: GraphContext,
    precision: list[Precision],
    reads: SlotReads,
    changed: dict[str, int],
    output_producers: set[int],
) -> list[int]:
    """The nodes the rewrite must look at, in graph order: those with an
    input whose tensor may not have the type the node reads it in, control
    flow, low ops whose attributes change, and graph outputs' producers (and
    readers). ``changed``: the tensors retyped low so far (float32 graph
    inputs, initializers, low nodes' outputs). On a large graph most nodes
    read what they need as it is: one lookup per input and a few array
    operations find the others, where the rewrite's loop would look at every
    input. Conservative: an input whose type or scope the arrays do not
    settle is looked at."""
    keep_all = bool(ctx.subgraphs)  # (with bodies to rewrite, even nodes without float32 are looked at)
    always = {i for i in output_producers if keep_all or precision[i] is not _UNCHANGED}
    always.update(ctx.subgraphs)
    always.update(i for i, op in enumerate(ctx.ops) if op in REWRITTEN_OPS and precision[i] is _LOW)
    for name in ctx.output_names:  # (its producer may rename it: its readers then need the Cast's)
        always.update(j for j, _ in ctx.readers(name))
    table = ctx.input_slots()
    flat, node = table.names, table.node
    if not flat:
        return sorted(always)
    n, count = len(ctx.ins), len(flat)
    # Each input's tensor: its type, or _RETYPED if it was float32 and is low now.
    t = ctx.input_types().copy()
    t[ctx.tensors().slots_in(changed)] = _RETYPED
    look = np.where(reads.low, t == FLOAT, t == _RETYPED)  # read low but float32, or read float32 but now low
    look |= (t == UNTYPED) | reads.odd
    if ctx.parent is not None:
        look |= ~np.fromiter(map(ctx.defines, flat), bool, count)  # (an outer value: its versions live there)
    look &= ~reads.agnostic
    if not keep_all:
        look &= np.fromiter(map(is_not, precision, repeat(_UNCHANGED)), bool, n)[node]
    always.update(np.unique(node[look]).tolist())
    return sorted(always)
