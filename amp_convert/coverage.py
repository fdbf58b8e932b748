"""Coverage: how much of a model's float compute a plan runs low, and why the rest stays fp32.

A stage after planning. It reads the model as planned (before the rewrite)
and its :class:`~amp_convert.plan.Plan`, and says:

* the **low share**: the fraction of the float compute, weighted by
  multiply-accumulates (MACs), of the nodes the plan runs low;
* the **causes** of the float compute that stays fp32, by the plan rule that
  kept it: ``unknown-type`` (rule "unknown-type"), ``custom-op``
  ("custom-domain", "local-function"), ``schema`` ("schema"), ``kernel``
  ("kernel", "runtime") and ``safety`` (rules "safety-..."). The other rules
  (the lists, the level, the user's rules, quantized ops, sources) keep a
  node fp32 by design: they are no cause;
* the **expected share**: what the level would lower on a fully typed graph,
  the low share plus the shares the causes hold. Where the op lists are
  given, a node a cause kept whose op the lists keep fp32 at this level
  anyway (the black list; at O1, an op on no list) is no cause either;
* a **warning** where the low share is below :data:`WARN_RATIO` of the
  expected share and the gap is at least :data:`WARN_GAP` of the compute:
  one line naming the causes with their node counts and shares.

The MACs are estimates (macs.py): they rank where the compute is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from .graph import GraphContext, build_context
from .lists import OpLists
from .macs import node_macs
from .op_rules import fp32_by_lists
from .plan import Plan, Precision

# The causes, in the order a report lists them when their shares tie.
CAUSES = ("unknown-type", "custom-op", "schema", "kernel", "safety")
_CAUSE_OF_RULE = {
    "unknown-type": "unknown-type",
    "custom-domain": "custom-op",
    "local-function": "custom-op",
    "schema": "schema",
    "kernel": "kernel",
    "runtime": "kernel",
}

# The warning: the low share below this fraction of the expected share ...
WARN_RATIO = 0.5
# ... and at least this fraction of the whole float compute between them (a
# small model's few fp32 nodes are not worth a warning).
WARN_GAP = 0.10


@dataclass(frozen=True, slots=True)
class Cause:
    """Float compute kept fp32 for one cause: how many nodes, their MACs and their share of the model's."""

    cause: str
    nodes: int
    macs: int
    share: float

    def as_dict(self) -> dict:
        return {"cause": self.cause, "nodes": self.nodes, "share": round(self.share, 6)}


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a model's float compute a plan runs low.

    ``total_macs``: the estimated MACs of every node with float compute;
    ``low_macs``: those of the nodes that run low; ``causes``: the float
    compute kept fp32 by each cause that holds some, largest share first."""

    level: str
    dtype: str
    total_macs: int
    low_macs: int
    causes: tuple[Cause, ...]

    @property
    def low_share(self) -> float:
        """Fraction of the float compute that runs low (0 where there is none)."""
        return self.low_macs / self.total_macs if self.total_macs else 0.0

    @property
    def expected_share(self) -> float:
        """Fraction the level would lower on a fully typed graph: the low share plus the causes' shares."""
        return self.low_share + sum(c.share for c in self.causes)

    def warning(self) -> str | None:
        """The WARN line where the low share is far below the expected one
        (see :data:`WARN_RATIO`, :data:`WARN_GAP`), naming the causes; None otherwise."""
        low, expected = self.low_share, self.expected_share
        if not (low < WARN_RATIO * expected and expected - low >= WARN_GAP):
            return None
        causes = ", ".join(_phrase(c, self.dtype) for c in self.causes)
        return (
            f"WARN coverage: {_percent(low)} of float compute runs low, where {self.level} would lower about "
            f"{_percent(expected)}: {causes}"
        )

    def summary(self) -> str:
        """The summary line's clause, e.g. ``97.3% of float compute low``."""
        return f"{_percent(self.low_share)} of float compute low" if self.total_macs else "no float compute"

    def as_dict(self) -> dict:
        """The report's ``coverage`` object (shares are fractions of ``total_macs``)."""
        return {
            "low_share": round(self.low_share, 6),
            "expected_share": round(min(self.expected_share, 1.0), 6),
            "total_macs": self.total_macs,
            "causes": [c.as_dict() for c in self.causes],
        }


def coverage(model: onnx.ModelProto, plan: Plan, ctx: GraphContext | None = None, lists: OpLists | None = None) -> Coverage:
    """The coverage of ``plan`` on ``model``, the model it was made for, as it
    was planned (before the rewrite changes it: a converted model's
    :class:`~amp_convert.pipeline.ConversionResult` holds its coverage).

    ``ctx``: the model's index, where the caller has it (else it is built);
    ``lists``: the op lists the plan used (``options.op_lists()``), which
    refine the expected share (see the module's docstring). Raises
    ValueError where the plan's graphs or node counts are not the model's."""
    ctx = build_context(model.graph) if ctx is None else ctx
    macs = node_macs(model, ctx)
    total = low = 0
    nodes: Counter = Counter()
    held: Counter = Counter()
    for c in ctx.walk():
        entries = plan.entries.get(c.path)
        if entries is None or len(entries) != len(c.nodes):
            where = f"graph {c.path!r}" if c.path else "the main graph"
            raise ValueError(f"the plan is not this model's: it has no entry for each node of {where}")
        weights = macs[c.path]
        for i, entry in enumerate(entries):
            precision, rule = entry.precision, entry.rule
            if precision is Precision.UNCHANGED or rule == "control-flow":
                continue
            weight = weights[i]
            total += weight
            if precision is Precision.LOW:
                low += weight
                continue
            cause = _CAUSE_OF_RULE.get(rule) or ("safety" if rule.startswith("safety-") else None)
            if cause is None or (lists is not None and fp32_by_lists(c.ops[i], c.domains[i], lists, plan.level)):
                continue
            nodes[cause] += 1
            held[cause] += weight
    causes = [Cause(k, nodes[k], held[k], held[k] / total if total else 0.0) for k in CAUSES if nodes[k]]
    causes.sort(key=lambda c: -c.macs)  # (stable: ties keep CAUSES' order)
    return Coverage(plan.level, plan.dtype, total, low, tuple(causes))


# ------------------------------------------------------------------ words


def _percent(share: float) -> str:
    """A share as the warning shows it: whole percents, one decimal below 10%, "<0.1%" for a trace."""
    if 0 < share < 0.001:
        return "<0.1%"
    return f"{share:.1%}" if share < 0.1 else f"{share:.0%}"


def _phrase(cause: Cause, dtype: str) -> str:
    n = cause.nodes
    s = "" if n == 1 else "s"
    what = {
        "unknown-type": f"{n} node{s} of unknown type",
        "custom-op": f"{n} custom op{s}",
        "schema": f"{n} node{s} whose schema admits no {dtype}",
        "kernel": f"{n} node{s} without a {dtype} kernel",
        "safety": f"{n} node{s} kept fp32 by the safety rules",
    }[cause.cause]
    return f"{what} ({_percent(cause.share)})"
