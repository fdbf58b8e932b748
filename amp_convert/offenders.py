"""The per-node diff's offenders: each node's error before and after it,
and what its rounding brings to the outputs (its own error times the gain
from it to the failing outputs), which ranks them: the answer to "which
node should stay fp32 to fix this output"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from .dtypes import FLOAT_TYPES
from .lists import EXACT_OPS
from .metrics import ErrorStats
from .plan import Plan
from .sequence_stats import SequenceStats


@dataclass
class NodeError:
    """Error of one node's outputs against fp32, and how much it added."""

    index: int
    name: str
    op_type: str
    precision: str
    error_before: float
    error_after: float
    # For a node that reads no other node's output and no graph input (a
    # Constant): the error its rounding brings to its readers' outputs (see
    # _reaching), else None.
    reaching: float | None = None
    # The error its own rounding brings to the outputs (the failing ones,
    # where any fail), relative to theirs: what the offenders rank by (see
    # _to_outputs); None where not estimated (``added`` ranks then).
    to_outputs: float | None = None

    @property
    def added(self) -> float:
        """Error this node adds over its worst input (for a node fed by
        constants alone, what it brings to its readers); a non-finite (Inf
        or NaN) result counts as infinite, after finite inputs only."""
        if not math.isfinite(self.error_before):
            return 0.0
        if not math.isfinite(self.error_after):
            return math.inf
        if self.reaching is not None:
            return self.reaching
        return max(self.error_after - self.error_before, 0.0)

    @property
    def can_round(self) -> bool:
        """Whether the node's own precision can add error: it runs low and is
        not an op that is exact in any precision (a Gather that picks the
        worse half of a tensor only seems to add error)."""
        return self.precision == "low" and self.op_type not in EXACT_OPS

    @property
    def rank_error(self) -> float:
        """What the offenders rank by: the error reaching the outputs where estimated, else ``added``."""
        return self.added if self.to_outputs is None else self.to_outputs

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "op_type": self.op_type,
            "precision": self.precision,
            "error_before": _json_float(self.error_before),
            "error_after": _json_float(self.error_after),
            "error_added": _json_float(self.added),
            "error_to_outputs": _json_float(self.rank_error),
        }


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def node_errors(
    ref_ctx,
    cand_ctx,
    stats: dict[str, ErrorStats | SequenceStats],
    plan: Plan | None,
    dtype: str = "fp16",
    outputs: set[str] | None = None,
) -> list[NodeError]:
    """Error after each node (worst of its float outputs; a sequence output's
    is its worst element's) and before it (worst of its float inputs that
    were measured), in topological order, and the error each brings to
    ``outputs`` (names; None: none estimated), its values rounded to
    ``dtype`` (see :func:`_to_outputs`)."""
    error = {name: s.relative_rms for name, s in stats.items()}
    planned = {e.name: e.precision.value for e in plan.entries.get("", [])} if plan is not None else {}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(ref_ctx.nodes):
        for x in node.input:
            readers.setdefault(x, []).append(i)
    nodes = []
    for i, node in enumerate(ref_ctx.nodes):
        after = [error[o] for o in node.output if o in error]
        if not after:
            continue
        before = [error[x] for x in node.input if x in error]
        fed = any(x in ref_ctx.producer or x in ref_ctx.input_set for x in node.input if x)
        reaching = None if fed else _reaching(ref_ctx, node, stats, readers)
        label = ref_ctx.node_label(i)
        if label in planned:
            precision = planned[label]
        else:
            low = any(cand_ctx.types.get(o) in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for o in node.output)
            precision = "low" if low else "fp32"
        nodes.append(
            NodeError(
                i,
                label,
                node.op_type,
                precision,
                max(before, default=0.0),
                max(after),
                reaching,
            )
        )
    if outputs is not None:
        _to_outputs(ref_ctx, nodes, stats, outputs, _ROUNDING[dtype])
    return nodes


# Readers through which an operand's relative error reaches the output as it is.
_RELATIVE_READERS = frozenset({"Mul", "Div", "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Reciprocal", "Pow"})


def _reaching(ref_ctx, node: onnx.NodeProto, stats: dict[str, ErrorStats | SequenceStats], readers: dict) -> float:
    """What the rounding of a node fed by constants alone (a Constant)
    brings to the outputs of the nodes reading it, the most of them: its
    relative error through a reader that multiplies by it (Mul, MatMul,
    ...), else (an Add of an epsilon, of a tiny constant) its error as a
    share of the reader's output, which its small values leave negligible."""
    worst = 0.0
    for out in node.output:
        own = stats.get(out)
        if own is None:
            continue
        rel = own.relative_rms
        for j in readers.get(out, ()):
            reader = ref_ctx.nodes[j]
            if reader.op_type in _RELATIVE_READERS:
                worst = max(worst, rel)
                continue
            measured = [stats[o] for o in reader.output if o in stats]
            scale = max((_rms(s) for s in measured), default=0.0)
            worst = max(worst, rel if scale == 0 else rel * min(1.0, _rms(own) / scale))
        if not readers.get(out):
            worst = max(worst, rel)
    return worst


def _rms(stats: ErrorStats | SequenceStats) -> float:
    """Root mean square of the reference's values (0 where unknown)."""
    count, total = getattr(stats, "count", 0), getattr(stats, "sum_sq_ref", 0.0)
    return math.sqrt(total / count) if count and math.isfinite(total) else 0.0


# RMS relative error of rounding a value to the low dtype (half a unit in the
# last place, spread evenly): what a node running low adds at the least.
_ROUNDING = {"fp16": 2.0**-11 / math.sqrt(3), "bf16": 2.0**-8 / math.sqrt(3)}
# Readers whose output is a sum of their inputs: an input's relative error
# reaches the output scaled by the input's size against the output's.
_ADDITIVE_READERS = frozenset({"Add", "Sub", "Sum"})
# An input of an unmeasured node with this many times the error measured
# after it evidently does not pass its error on (it selects: a mask).
_NOT_PASSED_ON = 10.0


def _to_outputs(ref_ctx, nodes: list[NodeError], stats: dict, outputs: set[str], rounding: float) -> None:
    """Set each node's ``to_outputs``: its own error times the gain from its
    output to ``outputs``, the most over the paths there.

    Own error: what the node adds over its inputs and, where the way to the
    outputs amplifies it, at least its output's rounding (``rounding``, as
    far as its measured error goes): a Conv with a large bias keeps less
    relative error than came in, yet rounds, and a cancellation after it
    amplifies that. A node fed by constants alone: its own relative error.

    Gain through a reader: its measured growth of relative error with its
    own share taken out (in quadrature; 1 where the growth is all its own,
    below 1 where the error shrinks); through an Add, Sub or Sum, the
    input's RMS against the output's; through a node whose outputs were not
    measured (a fused op), at most the error measured after it over the
    input's, and 0 for an input with over _NOT_PASSED_ON times that (an
    attention mask's clipped fill values). So an epsilon added to a
    variance brings almost nothing, and a large value a later subtraction
    cancels (a steep sigmoid's logit minus its threshold) brings its
    rounding amplified. A control-flow node passes gain back to the values
    its bodies read from the main graph as to its inputs."""
    by_index = {n.index: n for n in nodes}
    own: dict[int, float] = {}
    through: dict[int, float] = {}  # a node's gain from an input to its output (non-additive nodes)
    for n in nodes:
        if not math.isfinite(n.error_before):
            own[n.index] = 0.0
        elif not math.isfinite(n.error_after):
            own[n.index] = math.inf
        elif n.reaching is not None:
            own[n.index] = n.error_after
        else:
            own[n.index] = max(n.added, min(n.error_after, rounding) if n.can_round else 0.0)
        if math.isfinite(n.error_after) and math.isfinite(n.error_before) and n.error_before > 0:
            # (its growth, its own error taken out; growth all its own is a gain of 1, less is attenuation)
            kept = max(n.error_after**2 - own[n.index] ** 2, min(n.error_after, n.error_before) ** 2)
            through[n.index] = math.sqrt(kept) / n.error_before
    error = {name: s.relative_rms for name, s in stats.items()}
    gain = {name: 1.0 for name in outputs}
    captures: dict[int, list[str]] = {}  # control flow: the main graph's values its bodies read, beside its inputs
    for name, readers in ref_ctx.captured_by.items():
        for j in readers:
            captures.setdefault(j, []).append(name)
    came_out: dict[str, float] = {}  # an unmeasured tensor: the most error measured after it
    for i in range(len(ref_ctx.nodes) - 1, -1, -1):
        node = ref_ctx.nodes[i]
        reads = (*node.input, *captures.get(i, ()))
        out_gain = max((gain.get(o, 0.0) for o in node.output), default=0.0)
        out_error = max((error[o] if o in error else came_out.get(o, 0.0) for o in node.output), default=0.0)
        if i in by_index:
            n = by_index[i]
            # (its rounding counts beyond what it adds only where the way to the outputs amplifies it)
            mine = own[i] if out_gain > 1 or n.reaching is not None else max(n.added, 0.0)
            n.to_outputs = mine * out_gain if mine and out_gain else 0.0
        for x in reads:
            if x and x not in error:
                came_out[x] = max(came_out.get(x, 0.0), out_error)
        if not out_gain:
            continue
        scale = max((_rms(stats[o]) for o in node.output if o in stats), default=0.0)
        for x in reads:
            # (through tensors the diff did not measure too: a Conv's output a BatchNormalization
            # folds into, a fused op's; not into those known not to be float: a shape)
            known = ref_ctx.types.get(x)
            if not x or (known and known not in FLOAT_TYPES):
                continue
            if node.op_type in _ADDITIVE_READERS and x in stats:
                g = _rms(stats[x]) / scale if scale > 0 else 1.0
            elif i in by_index:
                g = through.get(i, 1.0)
            else:  # (not measured: no more than came out; far more came in than out: not passed on, a mask)
                came_in = error.get(x, 0.0)
                g = 1.0 if came_in <= out_error else 0.0 if came_in > _NOT_PASSED_ON * out_error else out_error / came_in
            gain[x] = max(gain.get(x, 0.0), g * out_gain)
