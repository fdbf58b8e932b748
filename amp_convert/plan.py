"""The plan: for every node of every graph, a precision and the reason for it.

A :class:`Plan` is plain data. It is printed by ``--explain``, written by
``--plan-json``, put in the report and asserted on by tests; the rewriter
only executes it. :mod:`amp_convert.planner` makes one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from .graph import NodeLabels
from .schema import op_key


class Precision(str, Enum):
    LOW = "low"
    FP32 = "fp32"
    UNCHANGED = "unchanged"  # no float32 computation: never touched


@dataclass(slots=True)
class PlanEntry:
    """The decision for one node."""

    graph: str  # "" for the main graph
    index: int  # position in its graph
    name: str  # node name, or OpType_index when the node has none
    op_type: str
    domain: str
    precision: Precision
    rule: str  # machine-readable rule id (e.g. "white-list", "schema")
    reason: str  # human-readable explanation
    low_inputs: tuple[int, ...] = ()  # input slots that run in the low dtype
    low_outputs: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["precision"] = self.precision.value
        return d


class GraphEntries(Sequence[PlanEntry]):
    """The entries of one graph, by node index. The rewrite and the
    summaries read the decisions as columns (:meth:`decision`,
    :meth:`columns`, :meth:`tally`)."""

    def __init__(self, path: str, names: list[str], ops: list[str]) -> None:
        self.path = path
        self._labels = NodeLabels(names, ops)  # (names checked UTF-8)
        self._entries: list[PlanEntry] = []

    @classmethod
    def of(cls, path: str, entries: Iterable[PlanEntry]) -> GraphEntries:
        """Entries made elsewhere (a plan built by hand), held as they are."""
        entries = list(entries)
        held = cls(path, [e.name for e in entries], [e.op_type for e in entries])
        for entry in entries:
            held.add(entry)
        return held

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i: int | slice) -> PlanEntry | list[PlanEntry]:  # type: ignore[override]
        return self._entries[i]

    def __iter__(self) -> Iterator[PlanEntry]:
        return iter(self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (GraphEntries, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable, like the list it stands for)

    def __repr__(self) -> str:
        return f"GraphEntries({self.path!r}, {len(self)} entries)"

    def label(self, i: int) -> str:
        """Node ``i``'s label (see :class:`graph.NodeLabels`)."""
        return self._labels[i]

    def add(self, entry: PlanEntry) -> None:
        """The next node's entry."""
        self._entries.append(entry)

    def decision(self, i: int) -> tuple[Precision, tuple[int, ...], tuple[int, ...]]:
        """Node ``i``'s precision and low input and output slots, as they are now."""
        entry = self._entries[i]
        return entry.precision, entry.low_inputs, entry.low_outputs

    def columns(self) -> tuple[list[Precision], list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Per node: its precision, and its low input and output slots (empty
        unless it runs low)."""
        entries = self._entries
        low = [e.precision is Precision.LOW for e in entries]
        return (
            [e.precision for e in entries],
            [e.low_inputs if is_low else () for e, is_low in zip(entries, low, strict=True)],
            [e.low_outputs if is_low else () for e, is_low in zip(entries, low, strict=True)],
        )

    def tally(self) -> Counter:
        """How many nodes have each (precision, rule, op type)."""
        return Counter((e.precision, e.rule, e.op_type) for e in self._entries)


@dataclass
class Plan:
    """Node -> precision + reason, for every graph of a model."""

    level: str
    dtype: str
    profile: str
    entries: dict[str, GraphEntries] = field(default_factory=dict)  # graph path -> entries by index
    notes: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)  # notes that say what to do, shown beside the command's summary
    # Nodes folded away before planning, as (node label, label of the node it was folded into), in node order.
    folded: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for path, entries in self.entries.items():  # (lists of entries given by hand)
            if not isinstance(entries, GraphEntries):
                self.entries[path] = GraphEntries.of(path, entries)

    def __iter__(self) -> Iterator[PlanEntry]:
        for entries in self.entries.values():
            yield from entries

    def entry(self, graph: str, index: int) -> PlanEntry:
        return self.entries[graph][index]

    def by_name(self, name: str, graph: str = "") -> PlanEntry:
        for e in self.entries[graph]:
            if e.name == name:
                return e
        raise KeyError(name)

    def tally(self) -> Counter:
        """How many nodes, in all graphs, have each (precision, rule, op type)."""
        tally: Counter = Counter()
        for entries in self.entries.values():
            tally.update(entries.tally())
        return tally

    def counts(self, tally: Counter | None = None) -> dict[str, int]:
        """Nodes per precision (from ``tally``, this plan's :meth:`tally` when
        the caller has it: a large plan's tally takes a while)."""
        by_precision: Counter = Counter()
        for (precision, _, _), n in (self.tally() if tally is None else tally).items():
            by_precision[precision] += n
        return {p.value: by_precision.get(p, 0) for p in Precision}

    def as_dict(self) -> dict:
        return {
            "level": self.level,
            "dtype": self.dtype,
            "profile": self.profile,
            "counts": self.counts(),
            "notes": self.notes,
            "nodes": [e.as_dict() for e in self],
            "folded": [{"node": node, "into": into} for node, into in self.folded],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    def format_table(self) -> str:
        """The ``--explain`` table: one line per node."""
        rows = [("graph", "node", "op", "precision", "reason")]
        for e in self:
            rows.append((e.graph or "main", e.name, op_key(e.op_type, e.domain), e.precision.value, e.reason))
        for node, into in self.folded:
            rows.append(("main", node, "BatchNormalization", "folded", f"folded into {into}, in fp32 arithmetic"))
        widths = [min(max(len(r[i]) for r in rows), 48) for i in range(4)]
        lines = []
        for r in rows:
            cells = [r[i][: widths[i]].ljust(widths[i]) for i in range(4)]
            lines.append("  ".join(cells) + "  " + r[4])
        c = self.counts()
        lines.append(f"{c['low']} low, {c['fp32']} fp32, {c['unchanged']} unchanged")
        return "\n".join(lines)
