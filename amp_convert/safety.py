"""Safety rule on constants: a node whose float constants the low dtype
cannot represent stays float32.

Static lists cannot know that one model's BatchNorm variance is 1e8 or that
an epsilon of 1e-12 becomes zero in fp16. The values can: this module looks
at the constants (initializers and Constant nodes, also when they reach the
node through data-movement ops such as Reshape) that a node would read in
low precision.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from .constant_stats import (
    SMALL_CONSTANT,
    ConstantFacts,
    ValueStats,
    attribute_constant,
    constant_array,
    graph_constant_facts,
    value_stats,
)
from .dtypes import LowDtype
from .graph import GraphContext
from .lists import ATTENTION_MASK_INPUTS, CONSTANT_MODE_INPUTS, PASS_THROUGH_ATTRIBUTES, PASS_THROUGH_OPS, VALUE_ATTRIBUTE_OPS

if TYPE_CHECKING:  # (calibration runs onnxruntime: its module is loaded where it is used)
    from .calibrate import Calibration

_MORE_INPUTS = frozenset(op for op, slots in PASS_THROUGH_OPS.items() if slots != (0,))  # (than the data)
_MAX_DEPTH = 8
_CONSTANT_CARRIERS = PASS_THROUGH_OPS.keys() | VALUE_ATTRIBUTE_OPS


class ConstantRanges:
    """Finds and caches the value statistics of the constants nodes read.

    With ``clip`` (``--clip-initializers``) values beyond the low dtype's
    range do not keep a node fp32: the rewrite clips and counts them.
    """

    def __init__(self, clip: bool = False, base_dir: Path | None = None) -> None:
        # (graph path, name) -> statistics: sibling subgraphs may each hold a constant of the same name
        self._stats: dict[tuple[str, str], ValueStats] = {}
        # graph path -> the facts gathered there, and each name's (facts, row) in them
        self._facts: dict[str, list[ConstantFacts]] = {}
        self._rows: dict[str, dict[str, tuple[ConstantFacts, int]]] = {}
        # (graph path, low dtype) -> the names there that may carry an unrepresentable constant,
        # and, for those judged, why a node cannot read them low (None: it can)
        self._suspects: dict[tuple[str, str], frozenset[str]] = {}
        self._verdicts: dict[tuple[str, str], dict[str, str | None]] = {}
        self._unused: dict[str, frozenset[str]] = {}  # graph path -> its unused_values
        self.clip = clip
        self.base_dir = base_dir

    def stats(self, scope: str, name: str, tensor: onnx.TensorProto) -> ValueStats:
        """Statistics of constant ``name`` defined in the graph at path ``scope``."""
        known = self.known(scope, name)
        if known is None:
            known = self._stats[scope, name] = value_stats(constant_array(tensor, self.base_dir))
        return known

    def known(self, scope: str, name: str) -> ValueStats | None:
        """The statistics of ``name`` gathered so far (None: not yet, or
        not finite: those are left to :meth:`stats`)."""
        found = self._stats.get((scope, name))
        if found is None:
            row = self._rows.get(scope, {}).get(name)
            if row is not None and row[0].finite[row[1]]:
                found = self._stats[scope, name] = row[0].stats(row[1])
        return found

    def gather(self, ctx: GraphContext, low: LowDtype) -> None:
        """Gather the facts on graph ``ctx``'s constants in ``low``, unless
        they are (by the planner)."""
        if ctx.path not in self._facts:
            self.adopt(ctx.path, graph_constant_facts(ctx.initializers, ctx.nodes, ctx.ops, low))

    def adopt(self, scope: str, facts: list[ConstantFacts]) -> None:
        """Take facts gathered on the graph at path ``scope``."""
        self._facts.setdefault(scope, []).extend(facts)
        rows = self._rows.setdefault(scope, {})
        for f in facts:
            rows.update(zip(f.names, ((f, row) for row in range(len(f.names))), strict=True))

    def drop_values(self, scope: str) -> None:
        """Let go of the converted values gathered on the graph at ``scope``
        (its rewrite is done); their statistics stay."""
        for facts in self._facts.get(scope, ()):
            facts.low_data = b""

    def low_values(self, scope: str, names: Iterable[str], low: LowDtype) -> list[tuple[bytes, int] | None]:
        """Per constant of ``names``: its values in ``low`` as raw bytes, and
        how many non-zero values became zero, from the facts gathered; None
        where they do not hold them (a value to clip, a non-finite one,
        another dtype, not gathered). (For many at once: a large graph lowers
        tens of thousands.)"""
        rows = self._rows.get(scope, {})
        found: list[tuple[bytes, int] | None] = []
        add = found.append
        key, high = low.key, low.max
        for row in map(rows.get, names):
            if row is None:
                add(None)
                continue
            facts, k = row
            data = facts.low_data
            if facts.low != key or not data or not facts.finite[k] or facts.abs_max[k] > high:
                add(None)  # (not data: dropped; a row holds at least one value)
                continue
            ends = facts.ends
            add((data[ends[k - 1] if k else 0 : ends[k]], facts.flushed.get(k, 0)))
        return found

    def constants_behind(self, ctx: GraphContext, name: str) -> list[tuple[str, str, onnx.TensorProto, str]]:
        """The constants whose values reach tensor ``name`` unchanged: (path
        of the graph defining each, its name, its tensor, how a reason names it)."""
        found, seen = [], set()
        todo = [(ctx, name, 0)]
        while todo:
            ctx, name, depth = todo.pop()
            if depth >= _MAX_DEPTH or (ctx.path, name) in seen:
                continue
            seen.add((ctx.path, name))
            tensor = ctx.initializers.get(name)
            if tensor is not None:
                found.append((ctx.path, name, tensor, f"constant {name!r}"))
                continue
            producer = ctx.producer.get(name)
            if producer is None:
                scope = None if ctx.parent is None or name in ctx.input_set else ctx.scope_of(name)
                if scope is not None:
                    todo.append((scope, name, depth + 1))
                continue
            op = ctx.ops[producer]
            if op in VALUE_ATTRIBUTE_OPS:
                constant = attribute_constant(ctx.nodes[producer], name)
                if constant is not None:
                    found.append((ctx.path, *constant, f"constant {name!r}"))
            elif op in PASS_THROUGH_OPS:
                held = _held(ctx, producer)
                if held is not None:
                    found.append(held)
                passed_on = _passed_on(ctx, producer)
                todo.extend((ctx, passed, depth + 1) for passed in reversed(passed_on) if passed)
        return found

    def problem(self, ctx: GraphContext, i: int, low_inputs: tuple[int, ...], low: LowDtype) -> str | None:
        """Why node ``i`` cannot read its constants in ``low`` (its inputs,
        and a value it holds itself: see :func:`held_constant`), or None."""
        held = _held(ctx, i)
        if held is not None:
            verdict = self._first_problem([held], low)
            if verdict is not None:
                return verdict
        suspects = self.suspects(ctx, low)
        verdicts = self._verdicts[ctx.path, low.key]
        inputs, unused = ctx.ins[i], unused_slot(ctx.ops[i], ctx.nodes[i])
        masks = mask_slots(ctx.ops[i], ctx.domains[i]) if "Attention" in ctx.ops[i] else frozenset()
        for slot in low_inputs:
            name = inputs[slot]
            if name not in suspects or slot == unused or slot in masks or name in self.unused(ctx):
                continue
            verdict = verdicts.get(name, _UNJUDGED)
            if verdict is _UNJUDGED:
                verdict = verdicts[name] = self._judge(ctx, name, low)
            if verdict is not None:
                return verdict
        return None

    def unused(self, ctx: GraphContext) -> frozenset[str]:
        """:func:`unused_values` of graph ``ctx``, found once: what they hold
        keeps no node fp32."""
        found = self._unused.get(ctx.path)
        if found is None:
            found = self._unused[ctx.path] = frozenset(unused_values(ctx))
        return found

    def suspects(self, ctx: GraphContext, low: LowDtype) -> frozenset[str]:
        """The float names in ``ctx`` that may carry constant values ``low``
        cannot hold: initializers not known to be fine, names from outer
        scopes, Constant outputs, and what the ops that pass a constant on
        make of any of these (the chains :meth:`constants_behind` follows). A
        node reading none of them low has no problem: the common case, found
        with one set test."""
        key = (ctx.path, low.key)
        found = self._suspects.get(key)
        if found is None:
            stats, path = self._stats, ctx.path
            self._verdicts.setdefault(key, {})
            names = set(ctx.free_names)
            # The constants the facts hold and ``low`` holds as they are are fine: the rest are looked at.
            gathered, remarkable = self._rows.get(path, {}), set()
            for facts in self._facts.get(path, ()):
                remarkable |= facts.remarkable(low)
            looked_at = set(ctx.initializers).difference(gathered) | remarkable.intersection(ctx.initializers)
            names.update(n for n in looked_at if not _unremarkable(stats.get((path, n)), low))
            ops, all_ins, all_outs = ctx.ops, ctx.ins, ctx.outs
            carriers = [i for i, op in enumerate(ops) if op in _CONSTANT_CARRIERS]
            for i in carriers:
                op, outs = ops[i], all_outs[i]
                if op == "Constant":  # (primed like an initializer: see constant_values)
                    looked = outs and (outs[0] not in gathered or outs[0] in remarkable)
                    if looked and not _unremarkable(stats.get((path, outs[0])), low):
                        names.update(outs)
                elif op == "ConstantOfShape":
                    names.update(outs)
                elif op in PASS_THROUGH_ATTRIBUTES:  # (Pad before opset 11: its value is a constant of its own)
                    held = _held(ctx, i)
                    if held is not None and not _unremarkable(self.stats(*held[:3]), low):
                        names.update(outs)
            if names:  # (what the ops passing a constant on make of these, in graph order: chains pass on)
                for i in carriers:
                    op, node_ins = ops[i], all_ins[i]
                    if op not in PASS_THROUGH_OPS or not node_ins:
                        continue
                    reached = not names.isdisjoint(_passed_on(ctx, i)) if op in _MORE_INPUTS else node_ins[0] in names
                    if reached:
                        names.update(all_outs[i])
            types = ctx.types
            found = self._suspects[key] = frozenset(n for n in names if types.get(n, onnx.TensorProto.FLOAT) in _MAYBE_FLOAT)
        return found

    def _judge(self, ctx: GraphContext, name: str, low: LowDtype) -> str | None:
        """Why tensor ``name`` cannot be read in ``low``: the values of the constants behind it."""
        return self._first_problem(self.constants_behind(ctx, name), low)

    def _first_problem(self, constants: list[tuple[str, str, onnx.TensorProto, str]], low: LowDtype) -> str | None:
        """Why the first of ``constants`` (as :meth:`constants_behind` lists
        them) that ``low`` cannot hold cannot, or None."""
        for scope, constant, tensor, what in constants:
            s = self.stats(scope, constant, tensor)
            if s.abs_max > low.max and not self.clip:
                return f"safety: {what} holds values up to {s.abs_max:.4g}, beyond {low.name}'s max {low.max:.6g}"
            lost = s.underflow(low)
            if lost and (s.size <= SMALL_CONSTANT or lost * 2 > s.nonzero):
                return f"safety: {lost} of {s.nonzero} non-zero values of {what} would become 0 in {low.name}"
        return None


def _passed_on(ctx: GraphContext, i: int) -> list[str]:
    """The inputs of node ``i`` of ``ctx``, a pass-through op, whose values it
    passes on in its mode."""
    op, inputs, node = ctx.ops[i], ctx.ins[i], ctx.nodes[i]
    slots = PASS_THROUGH_OPS[op]
    if slots is None:
        return inputs
    unused = unused_slot(op, node)
    return [inputs[k] for k in slots if k < len(inputs) and k != unused]


def unused_slot(op: str, node: onnx.NodeProto) -> int | None:
    """The input ``node`` (of ``op``) does not read in its mode (see
    ``CONSTANT_MODE_INPUTS``: a Pad's constant_value outside constant mode),
    or None."""
    slot = CONSTANT_MODE_INPUTS.get(op)
    return None if slot is None or _in_constant_mode(node) else slot


@cache
def mask_slots(op: str, domain: str) -> frozenset[int]:
    """The inputs of ``op`` (of ``domain``) that carry an additive attention
    mask (``ATTENTION_MASK_INPUTS``, by the newest schema's input names):
    the range rules do not judge them."""
    from . import ortschema

    versions = ortschema.extra_schemas().get(("" if domain in ("", "ai.onnx") else domain, op), ())
    if versions:
        names = [p.name for p in versions[-1].inputs]
    elif domain in ("", "ai.onnx") and onnx.defs.has(op):
        names = [p.name for p in onnx.defs.get_schema(op).inputs]
    else:
        return frozenset()
    return frozenset(k for k, name in enumerate(names) if name in ATTENTION_MASK_INPUTS)


def unused_values(ctx: GraphContext, low_ins: list[tuple[int, ...]] | None = None) -> set[str]:
    """The tensors of ``ctx`` whose values reach no value: each read of
    them is one its node does not use in its mode (see
    :func:`unused_slot`), or a pass-through op's (an Identity's) whose
    outputs are such tensors too; no subgraph reads them and no graph
    outputs them, so a change to what they hold is no error. With
    ``low_ins`` (each node's low input slots), of the reads in the low
    dtype only: the tensors whose low versions (what the rewrite stores and
    clips) no node uses."""
    ops, nodes, ins = ctx.ops, ctx.nodes, ctx.ins
    if CONSTANT_MODE_INPUTS.keys().isdisjoint(ops):  # (most graphs: none, found in C)
        return set()
    seeds = []
    for i in [i for i, op in enumerate(ops) if op in CONSTANT_MODE_INPUTS]:
        slot = unused_slot(ops[i], nodes[i])
        if slot is not None and slot < len(ins[i]) and ins[i][slot]:
            seeds.append(ins[i][slot])
    candidates = _passed_to(ctx, seeds)
    outputs = set(ctx.output_names)
    kept = [name for name in candidates if name not in ctx.captured_by and name not in outputs]
    dead = set(kept)
    while True:  # (a tensor read by a pass-through op whose outputs turn out to be used is used)
        used = {name for name in dead if not all(_unused_read(ctx, j, slot, dead) for j, slot in ctx.readers(name))}
        if not used:
            break
        dead -= used
    if low_ins is None:
        return dead
    found = set()
    for name in kept:
        low_reads = [(j, slot) for j, slot in ctx.readers(name) if slot in low_ins[j]]
        if low_reads and all(_unused_read(ctx, j, slot, dead) for j, slot in low_reads):
            found.add(name)
    return found


def _passed_to(ctx: GraphContext, names: list[str]) -> list[str]:
    """``names``, and the tensors whose values pass-through ops pass on to
    them (an Identity's input, and what reaches that): the tensors that
    may reach no value when ``names`` reach none."""
    found, todo = dict.fromkeys(names), list(names)
    while todo:
        i = ctx.producer.get(todo.pop())
        if i is not None and ctx.ops[i] in PASS_THROUGH_OPS:
            for name in _passed_on(ctx, i):
                if name and name not in found:
                    found[name] = None
                    todo.append(name)
    return list(found)


def _unused_read(ctx: GraphContext, j: int, slot: int, dead: set[str]) -> bool:
    """Whether node ``j``'s read at ``slot`` reaches no value: a slot it
    does not read in its mode, or one whose value it passes on (a
    pass-through op) to outputs that are all in ``dead``."""
    op = ctx.ops[j]
    if slot == unused_slot(op, ctx.nodes[j]):
        return True
    passed = PASS_THROUGH_OPS.get(op, ())
    return (passed is None or slot in passed) and all(out in dead for out in ctx.outs[j] if out)


def _in_constant_mode(node: onnx.NodeProto) -> bool:
    """Whether a Pad pads with a value of its own (``mode`` absent or
    "constant"), rather than with values of its data (reflect, edge, wrap)."""
    return all(a.name != "mode" or a.s == b"constant" for a in node.attribute)


def held_constant(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The value a pass-through node holds itself and passes on with its
    data (see ``PASS_THROUGH_ATTRIBUTES``: Pad before opset 11 pads with its
    ``value`` attribute), as a tensor; None where it holds none, or zero
    (which every dtype holds), or does not use it (a Pad whose mode is
    reflect or edge pads with values of its data)."""
    attribute = PASS_THROUGH_ATTRIBUTES.get(node.op_type)
    if attribute is None or not _in_constant_mode(node):
        return None
    held = None
    for a in node.attribute:
        if a.name == attribute and a.type == onnx.AttributeProto.FLOAT and a.f:
            held = a.f
    return None if held is None else numpy_helper.from_array(np.array(held, np.float32))


def _held(ctx: GraphContext, i: int) -> tuple[str, str, onnx.TensorProto, str] | None:
    """Node ``i``'s :func:`held_constant`, as :meth:`ConstantRanges.constants_behind`
    lists a constant: under the name of the node's output (no constant of
    its graph has it, so its statistics are cached apart)."""
    op = ctx.ops[i]
    if op not in PASS_THROUGH_ATTRIBUTES or not ctx.outs[i] or not ctx.outs[i][0]:
        return None
    tensor = held_constant(ctx.nodes[i])
    if tensor is None:
        return None
    return ctx.path, ctx.outs[i][0], tensor, f"the {PASS_THROUGH_ATTRIBUTES[op]} attribute of {op} {ctx.node_label(i)!r}"


def _unremarkable(s: ValueStats | None, low: LowDtype) -> bool:
    """Known statistics of a constant ``low`` holds as it is: within range, nothing flushed."""
    return s is not None and s.abs_max <= low.max and not s.underflow(low)


_UNJUDGED = object()
_MAYBE_FLOAT = frozenset({onnx.TensorProto.FLOAT, 0})


def data_range_problem(
    ctx: GraphContext, node: onnx.NodeProto, calibration: Calibration | None, data_max: float, unused: frozenset[str]
) -> str | None:
    """Calibrated rule: a node whose float inputs or outputs reached more than
    ``data_max`` in magnitude in the fp32 run stays fp32 (main graph only:
    calibration sees the main graph's tensors). An input the node does not
    read in its mode (see :func:`unused_slot`) is not judged, nor an
    attention mask (see :func:`mask_slots`), nor one in ``unused`` (the
    graph's :func:`unused_values`), nor a pass-through op's output there
    (it holds what the op passes on)."""
    if calibration is None or ctx.parent is not None:
        return None
    worst, where = 0.0, ""
    slot = unused_slot(node.op_type, node)
    masks = mask_slots(node.op_type, node.domain) if "Attention" in node.op_type else frozenset()
    inputs = [name for k, name in enumerate(node.input) if k != slot and k not in masks and name not in unused]
    outputs = [name for name in node.output if node.op_type not in PASS_THROUGH_OPS or name not in unused]
    for name in (*inputs, *outputs):
        value = calibration.abs_max(name) if name else None
        if value is not None and value > worst:
            worst, where = value, name
    if worst > data_max:
        return f"safety: {where!r} reaches {worst:.4g} in the fp32 run, above `data_max` {data_max:.6g}"
    return None
