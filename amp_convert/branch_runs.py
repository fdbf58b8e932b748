"""Which branches of the main graph's Ifs the validation samples ran: each
condition is read from the reference's runs, and the branches no sample
ran are what the verdict does not cover."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .graph import GraphContext
from .schema import is_default_domain


@dataclass
class BranchRuns:
    """How many samples ran each branch of one If of the main graph."""

    node: str  # the If's label
    condition: str  # the tensor its condition is
    then_runs: int = 0
    else_runs: int = 0

    def record(self, values: Mapping[str, np.ndarray]) -> None:
        """One sample's run: ``values`` holds its condition (else it is not counted)."""
        value = values.get(self.condition)
        if value is None or not np.size(value):
            return
        if np.asarray(value).reshape(-1)[0]:
            self.then_runs += 1
        else:
            self.else_runs += 1

    @property
    def unrun(self) -> str | None:
        """The branch no sample ran ("then_branch", "else_branch"), or None."""
        if self.then_runs and not self.else_runs:
            return "else_branch"
        if self.else_runs and not self.then_runs:
            return "then_branch"
        return None

    def as_dict(self) -> dict:
        return {"node": self.node, "then_branch": self.then_runs, "else_branch": self.else_runs}


def if_branches(ctx: GraphContext) -> list[BranchRuns]:
    """A count, at zero, for each If of the main graph ``ctx`` whose
    condition is not a constant (a constant one runs the same branch by design)."""
    constants = set(ctx.initializers) | {out for i, op in enumerate(ctx.ops) if op == "Constant" for out in ctx.outs[i]}
    return [
        BranchRuns(ctx.node_label(i), ctx.ins[i][0])
        for i, op in enumerate(ctx.ops)
        if op == "If" and is_default_domain(ctx.domains[i]) and ctx.ins[i] and ctx.ins[i][0] not in constants
    ]


def unrun_note(branches: list[BranchRuns]) -> str:
    """What the verdict does not rest on: the branches no sample ran (empty
    where every branch ran, or no condition was read)."""
    unrun = [(b.node, b.unrun) for b in branches if b.unrun]
    if not unrun:
        return ""
    listed = ", ".join(f"the {branch} of {node}" for node, branch in unrun[:3])
    more = f" and {len(unrun) - 3} more" if len(unrun) > 3 else ""
    return f"no sample ran {listed}{more}: the verdict does not cover {'it' if len(unrun) == 1 else 'them'}"
