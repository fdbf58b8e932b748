"""Classification: decide a precision and a reason for every node.

The result, a :class:`Plan`, is plain data: it is printed by ``--explain``,
written by ``--plan-json``, put in the report, and asserted on by tests. The
rewriter only executes it.

Order of the rules (first match wins):

1. nodes with no float32 tensor are left unchanged (integer, bool, already low),
   and so are the ops that read one for its shape alone (Shape, Size);
2. control flow keeps its interface types (its bodies get plans of their own);
   quantized ops, ops of unknown type, calls of the model's local functions
   (their bodies are left as they are), and custom-domain ops not named in a
   list stay float32; level O0 changes nothing;
3. user rules: ``--keep-fp32`` then ``--force-low`` (node-name regexes);
4. source ops (Constant, Cast(to=float), RandomNormal ...) take the precision
   their consumers need;
5. the level and the lists: white / black / follow / unlisted;
6. the schema at the model's opset must admit the low dtype;
7. safety (O1, O2): a node fed a constant that the low dtype cannot represent
   stays float32.

Follow nodes take the precision of the data reaching them (one forward pass
in topological order). Nodes fed only by constants and graph inputs are
"neutral" and, like sources, are resolved from their consumers (one backward
pass). Subgraphs are planned after their parent's forward pass.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import onnx

from .availability import KernelRule
from .dtypes import FLOAT, LowDtype
from .graph import GraphContext, NodeLabels, attribute_int, cast_to, check_utf8
from .lists import (
    CONTROL_FLOW_OPS,
    CONVERTED_INPUTS,
    DTYPE_AGNOSTIC_INPUTS,
    NO_LOW_KERNEL_OPS,
    ORT_QUANTIZED_OPS,
    QUANTIZED_OPS,
    SOURCE_OPS,
    OpLists,
)
from .options import ConvertOptions
from .safety import ConstantRanges, data_range_problem
from .schema import (
    DEFAULT_DOMAINS,
    Signature,
    first_opset_admitting,
    is_default_domain,
    model_opsets,
    op_key,
    opset_domain,
    signature,
)
from .typeinfo import NOT_A_TENSOR

if TYPE_CHECKING:  # (calibration runs onnxruntime: its module is loaded where it is used)
    from .calibrate import Calibration


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


# Ops that read their float input for its shape alone (Shape, Size): they
# compute nothing in float32 or low, whatever version of it they read.
_SHAPE_READERS = {op: frozenset(slots) for op, slots in DTYPE_AGNOSTIC_INPUTS.items() if op not in CONVERTED_INPUTS}

# Data precision of a tensor while planning.
LOW, F32, NEUTRAL = "low", "fp32", "neutral"
_FIXED, _FOLLOW, _SOURCE = "fixed", "follow", "source"  # states of the forward pass (the last two provisional)
_SEEN_LOW, _SEEN_F32 = 1, 2  # which data states reach a node (bits)


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


class Planner:
    """Builds a :class:`Plan` for a model whose graphs are indexed and typed."""

    def __init__(
        self,
        model: onnx.ModelProto,
        options: ConvertOptions,
        lists: OpLists,
        ranges: ConstantRanges,
        calibration: Calibration | None = None,
    ):
        self.options = options
        self.calibration = calibration
        self.data_max = options.effective_data_max
        self.keep_names = frozenset(options.keep_fp32_nodes)
        self.force_names = frozenset(options.force_low_nodes)
        self.level = options.effective_level
        self.low: LowDtype = options.low
        self.lists = lists
        self.ranges = ranges
        self.opsets = model_opsets(model)
        self.local_functions = frozenset((f.domain, f.name) for f in model.functions)
        self.keep_patterns = options.patterns("keep_fp32")
        self.force_patterns = options.patterns("force_low")
        self.safety = options.safety_on
        self.constants_rule = self.safety and options.initializer_range
        self.plan = Plan(self.level, options.dtype, lists.profile, notes=list(lists.notes))
        self.states: dict[str, str] = {}  # data precision of float tensors, across scopes (names are unique)
        self.demand = Demand(self.plan, self.low, options.io_types)
        self.kernels = KernelRule(options.target_provider, self.low)
        self._slot_cache: dict = {}
        self._sigs: dict[tuple[str, str], Signature | None] = {}  # (op, domain) -> signature at the model's opset
        self._has_qdq = False  # set per graph: any DequantizeLinear / QuantizeLinear
        self._by_kind = not (self.keep_patterns or self.force_patterns or self.keep_names or self.force_names)
        self._decisions: dict[tuple, tuple] = {}  # (op, domain, float slots) -> decision, without name rules
        self._float_slots: list = []
        # op -> the opset (one onnxruntime loads) from which its schema admits the low dtype, for ops it kept fp32
        self._admitted_later: dict[str, int] = {}

    # ---------------------------------------------------------------- driver

    def run(self, ctx: GraphContext) -> Plan:
        self._plan_graph(ctx)
        kept = sum(n for (_, rule, _), n in self.plan.tally().items() if rule == "kernel")
        kernel_note = self.kernels.note(kept)
        if kernel_note is not None:
            self.plan.notes.append(kernel_note)
        if self._admitted_later:  # (a bf16 plan keeping its Convs fp32 says so where a summary line is read)
            note = self._upgrade_note()
            self.plan.notes.append(note)
            self.plan.hints.append(note)
        return self.plan

    def _upgrade_note(self) -> str:
        """The ops the schemas kept fp32 that a newer opset would let run low,
        said once for the whole plan: a bf16 model below opset 22 keeps its
        Convs (and the Casts around them) fp32, which the per-node reasons say
        one by one and a summary of how little runs low does not say at all."""
        later = self._admitted_later
        return (
            f"{', '.join(sorted(later))} stay fp32: the schemas at opset {self.opsets.get('', 0)} admit no "
            f"{self.low.name} for them; --target-opset {max(later.values())} upgrades the model to one whose schemas do"
        )

    def _plan_graph(self, ctx: GraphContext) -> None:
        names = ctx.node_names()
        check_utf8(names)
        entries = self.plan.entries[ctx.path] = GraphEntries(ctx.path, names, ctx.ops)
        is_main = ctx.parent is None
        source_state = LOW if (is_main and self.options.io_types == "low") else NEUTRAL
        types, states = ctx.types, self.states
        for name in ctx.input_names:
            if self._is_float_data(types.get(name, 0)):
                states[name] = source_state
        for name in ctx.initializers:
            if self._is_float_data(types.get(name, 0)):
                states[name] = NEUTRAL
        self._has_qdq = has_qdq = not {"DequantizeLinear", "QuantizeLinear"}.isdisjoint(ctx.ops)
        # Float32 input and output slots of every node, found once and shared by all rules.
        floats = [_float_slots(ctx, i) for i in range(len(ctx.nodes))]
        self._float_slots = floats
        pending: list[int] = []  # neutral follow nodes and sources, resolved backwards
        subgraphs = ctx.subgraphs
        if self.constants_rule:
            self.ranges.gather(ctx, self.low)
        for i in range(len(ctx.nodes)):
            entry, state = self._classify(ctx, i, entries.label(i))
            entries.add(entry)
            if state == _FOLLOW and not self._resolve_follow(ctx, i, entry):
                state = NEUTRAL
            if state in (NEUTRAL, _SOURCE):
                pending.append(i)
            if i in subgraphs:  # bodies are planned where they run: outer values they read have their states
                for sub in subgraphs[i]:
                    self._plan_graph(sub)
                self._float_slots, self._has_qdq = floats, has_qdq
                if ctx.ops[i] == "If" and entry.rule == "control-flow":
                    self._lower_if_outputs(ctx, i, entry)
            self._record_output_states(ctx, i, entry.precision, entry.low_outputs, neutral=state in (NEUTRAL, _SOURCE))
        for i in reversed(pending):
            self._resolve_pending(ctx, i, entries)

    def _seen_states(self, ctx: GraphContext, i: int) -> int:
        """Which data states reach node ``i`` (bits _SEEN_LOW, _SEEN_F32), as the follow rule sees them."""
        return _seen_bits(set(map(self.states.get, ctx.ins[i])))

    # ------------------------------------------------------- classification

    def _classify(self, ctx: GraphContext, i: int, label: str) -> tuple[PlanEntry, str]:
        node = ctx.nodes[i]
        op, domain = ctx.ops[i], ctx.domains[i]
        precision, rule, reason, state = self._decide(ctx, i, node, op, domain, label)
        entry = PlanEntry(ctx.path, i, label, op, domain, precision, rule, reason)
        if precision is Precision.LOW:  # wanted low: the schema and the safety rules may still say no
            forced = rule in ("user-force-low", "auto-force-low")
            self._try_low(ctx, i, entry, self._sig(ctx, i), safety=not forced)
        return entry, state

    def _decide(self, ctx: GraphContext, i: int, node: onnx.NodeProto, op: str, domain: str, label: str) -> tuple:
        """(precision, rule, reason, state) from the rules in order; first match
        wins. Without node-name rules the decision depends only on the op and
        which of its slots carry float32, so it is made once per such kind."""
        if self._has_qdq or op == "Constant":
            special = self._context_rule(ctx, i, node, op, domain)
            if special is not None:
                return special
        if self._by_kind and op != "Cast" and not _stash_in_data_type(op, node):
            key = (op, domain, self._float_slots[i])
            decision = self._decisions.get(key)
            if decision is None:
                decision = self._decisions[key] = self._apply_rules(ctx, i, node, op, domain, label)
            return decision
        return self._apply_rules(ctx, i, node, op, domain, label)

    def _context_rule(self, ctx: GraphContext, i: int, node: onnx.NodeProto, op: str, domain: str) -> tuple | None:
        """Rules that look past the op type (its neighbours, its attributes)."""
        if domain not in DEFAULT_DOMAINS:
            return None
        if self._has_qdq and self._float_slots[i][:2] != ((), ()):
            producer, ops = ctx.producer, ctx.ops
            fed = any(ops[producer[n]] == "DequantizeLinear" for n in ctx.ins[i] if n in producer)
            feeds = any(ops[j] == "QuantizeLinear" for n in ctx.outs[i] for j, _ in ctx.readers(n))
            if fed or feeds:
                where = "reads a DequantizeLinear" if fed else "feeds a QuantizeLinear"
                return Precision.FP32, "quantized", f"part of a QDQ-quantized computation ({where}): never touched", _FIXED
        if op == "Constant" and any(a.name == "sparse_value" for a in node.attribute):
            return Precision.FP32, "sparse-constant", "a sparse Constant value is left as it is", _FIXED
        return None

    def _apply_rules(self, ctx: GraphContext, i: int, node: onnx.NodeProto, op: str, domain: str, label: str) -> tuple:
        default_domain = domain in DEFAULT_DOMAINS
        key = op if default_domain else op_key(op, domain)
        if default_domain and op in CONTROL_FLOW_OPS:
            return Precision.FP32, "control-flow", "keeps its interface types; its bodies are converted", _FIXED
        float_ins, float_outs, unknown = self._float_slots[i]
        if not float_ins and not float_outs:
            return Precision.UNCHANGED, "no-float32", "no float32 tensors (integer, bool or already low)", _FIXED
        if self.level == "O0":
            return Precision.FP32, "level", "O0 changes nothing", _FIXED
        if default_domain and op in QUANTIZED_OPS:
            return Precision.FP32, "quantized", "quantized computation is never touched", _FIXED
        if key in ORT_QUANTIZED_OPS:
            return Precision.FP32, "quantized", f"{key} is onnxruntime's quantized op: never touched", _FIXED
        if default_domain and op == "Cast" and cast_to(node) != FLOAT:
            return Precision.UNCHANGED, "cast", "Cast to a non-float32 type reads any float version", _FIXED
        if default_domain and op in _SHAPE_READERS and not float_outs and _SHAPE_READERS[op].issuperset(float_ins):
            why = f"{op} reads only the shape of its float input: it computes in no float type"
            return Precision.UNCHANGED, "shape-only", why, _FIXED
        if unknown:
            return Precision.FP32, "unknown-type", "a tensor's type is unknown (or it is a sequence); left as it is", _FIXED
        if default_domain and self._sig(ctx, i) is None:
            return Precision.FP32, "schema", f"no schema for {op} at this opset", _FIXED
        if (domain, op) in self.local_functions:  # (whatever the lists say: low inputs would not fit its fp32 body)
            why = f"calls the model's local function {key}, whose body is left as it is: it reads and writes fp32"
            return Precision.FP32, "local-function", why, _FIXED
        if not default_domain and not self._listed(key) and not self._forced(label):
            return Precision.FP32, "custom-domain", f"custom-domain op {key}: fp32 unless on the white list", _FIXED
        for pattern in self.keep_patterns:
            if pattern.search(label):
                return Precision.FP32, "user-keep-fp32", f"--keep-fp32 {pattern.pattern!r}", _FIXED
        if label in self.keep_names:
            return Precision.FP32, "auto-keep-fp32", "auto search: kept fp32 (it added error)", _FIXED
        for pattern in self.force_patterns:
            if pattern.search(label):
                return Precision.LOW, "user-force-low", f"--force-low {pattern.pattern!r}", _FIXED
        if label in self.force_names:
            return Precision.LOW, "auto-force-low", "auto search: runs low within tolerance", _FIXED
        if default_domain and op in SOURCE_OPS:
            return Precision.FP32, "source", "creates float data: takes the precision its consumers need", _SOURCE
        if default_domain and _stash_in_data_type(op, node) and self.level != "O3" and key in self.lists.follow:
            why = "stash_type 0: its mean and variance are computed in the data's type, not float32"
            return Precision.FP32, "stash-type", why, _FIXED
        return list_rule(self.lists, self.level, key)

    def _listed(self, key: str) -> bool:
        lists = self.lists
        return key in lists.white or key in lists.black or key in lists.follow

    def _forced(self, label: str) -> bool:
        return any(p.search(label) for p in self.force_patterns)

    # ------------------------------------------------------ schema + safety

    def _try_low(self, ctx: GraphContext, i: int, entry: PlanEntry, sig: Signature | None, safety: bool = True) -> PlanEntry:
        """Make ``entry`` LOW if the schema and the safety rules allow it."""
        float_ins, float_outs, _ = self._float_slots[i]
        key = (id(sig), float_ins, float_outs)  # signatures are cached singletons
        slots = self._slot_cache.get(key)
        if slots is None:
            node = ctx.nodes[i]
            opset = self.opsets.get(opset_domain(node.domain), 0)
            slots = self._slot_cache[key] = lowered_slots(node.op_type, node.domain, float_ins, float_outs, sig, self.low, opset)
            if isinstance(slots, str):
                self._remember_admitting(node.op_type, node.domain, opset)
        if isinstance(slots, str):
            entry.precision, entry.rule = Precision.FP32, "schema"
            entry.reason = f"{slots} (wanted low: {entry.reason})"
            return entry
        forced = entry.rule in ("user-force-low", "auto-force-low")
        if not forced and ctx.ops[i] in NO_LOW_KERNEL_OPS and is_default_domain(ctx.domains[i]):
            entry.precision, entry.rule = Precision.FP32, "runtime"
            entry.reason = f"onnxruntime has no {self.low.name} kernel for {ctx.ops[i]} (wanted low: {entry.reason})"
            return entry
        if not forced:
            missing = self.kernels.missing(ctx.ops[i], ctx.domains[i], self.opsets.get(opset_domain(ctx.domains[i]), 0))
            if missing is not None:
                entry.precision, entry.rule = Precision.FP32, "kernel"
                entry.reason = f"{missing} (wanted low: {entry.reason})"
                return entry
        low_inputs, low_outputs = slots
        if safety and self.safety:
            found = self._safety_problem(ctx, i, low_inputs)
            if found is not None:
                rule, problem = found
                entry.precision, entry.rule = Precision.FP32, rule
                entry.reason = f"{problem} (wanted low: {entry.reason})"
                return entry
        entry.precision = Precision.LOW
        entry.low_inputs, entry.low_outputs = low_inputs, low_outputs
        return entry

    def _remember_admitting(self, op_type: str, domain: str, opset: int) -> None:
        """For the plan's note: the opset whose schema would admit the low dtype
        for an op the schema keeps fp32, where onnxruntime loads that opset."""
        found = admitting_opset(op_type, domain, opset, self.low)  # (as lowered_slots found it: cached)
        if found is not None and found[1]:
            self._admitted_later[op_key(op_type, domain)] = found[0]

    def _safety_problem(self, ctx: GraphContext, i: int, low_inputs: tuple[int, ...]) -> tuple[str, str] | None:
        """(rule, why) when a safety rule keeps node ``i`` fp32, reading ``low_inputs`` low."""
        if self.constants_rule:
            problem = self.ranges.problem(ctx, i, low_inputs, self.low)
            if problem:
                return "safety-initializer-range", problem
        if self.calibration:
            problem = data_range_problem(ctx, ctx.nodes[i], self.calibration, self.data_max, self.ranges.unused(ctx))
            if problem:
                return "safety-data-range", problem
        return None

    def _lower_if_outputs(self, ctx: GraphContext, i: int, entry: PlanEntry) -> None:
        """An If output that every branch produces low is low itself (where
        If's schema admits the low type: bfloat16 from opset 16 on): its
        branches hand over their low tensors, and a Cast after the If (only
        where a reader needs fp32) replaces one per branch back to fp32."""
        branches = ctx.subgraphs[i]
        sig, low = self._sig(ctx, i), self.low.onnx_type
        low_outputs = []
        for k, name in enumerate(ctx.outs[i]):
            if not name or ctx.types.get(name) != FLOAT:
                continue
            out_type = sig.output_type(k) if sig is not None else None
            if out_type is None or not sig.admits(out_type, low):  # (If outputs admit bfloat16 from opset 16 on)
                continue
            if all(self._low_branch_output(body, k) for body in branches):
                low_outputs.append(k)
        if low_outputs:
            entry.precision, entry.low_outputs = Precision.LOW, tuple(low_outputs)
            listed = ", ".join(map(str, low_outputs))
            entry.reason = f"every branch produces output{'s' if len(low_outputs) > 1 else ''} {listed} low"

    def _low_branch_output(self, body: GraphContext, k: int) -> bool:
        names = body.output_names
        if k >= len(names) or body.types.get(names[k], body.type_of(names[k])) != FLOAT:
            return False
        # A name listed twice could need two types at once.
        return self.states.get(names[k]) is LOW and names.count(names[k]) == 1

    # ------------------------------------------------------- follow / neutral

    def _resolve_follow(self, ctx: GraphContext, i: int, entry: PlanEntry) -> bool:
        """Decide a follow node from its inputs; False if it is fed only by
        neutral data (constants, graph inputs) and must wait for its consumers."""
        seen = self._seen_states(ctx, i)
        if not seen:
            entry.reason = f"{entry.reason}; fed only by constants or graph inputs"
            return False
        if seen == _SEEN_F32:
            entry.reason = f"{entry.reason}; its inputs are fp32"
        elif seen == _SEEN_LOW or self.level != "O1":
            mixed = "mixed fp32/low inputs" if seen == _SEEN_LOW | _SEEN_F32 else "its inputs are low"
            self._try_low(ctx, i, entry, self._sig(ctx, i))
            if entry.precision is Precision.LOW:
                entry.reason = f"{entry.reason}; {mixed}"
        else:
            entry.reason = f"{entry.reason}; mixed inputs run in the widest type (O1)"
        return True

    def _record_output_states(
        self, ctx: GraphContext, i: int, precision: Precision, low_outputs: tuple[int, ...], neutral: bool
    ) -> None:
        types, states = ctx.types, self.states
        low_outputs = low_outputs if precision is Precision.LOW else ()
        for k, name in enumerate(ctx.outs[i]):
            t = types.get(name, 0) if name else 0
            if self._is_float_data(t):
                states[name] = _output_state(neutral, t != FLOAT or k in low_outputs)

    def _resolve_pending(self, ctx: GraphContext, i: int, entries: GraphEntries) -> None:
        """:meth:`_resolve_from_consumers` for node ``i``."""
        self._resolve_from_consumers(ctx, i, entries[i], self._consumer_needs(ctx, i))

    def _consumer_needs(self, ctx: GraphContext, i: int) -> set[int]:
        """The element types the consumers of node ``i``'s float32 outputs need."""
        wants: set[int] = set()
        for name in ctx.outs[i]:
            if name and ctx.types.get(name) == FLOAT:
                wants |= self.demand.requirements(ctx, name)
        return wants

    def _resolve_from_consumers(self, ctx: GraphContext, i: int, entry: PlanEntry, wants: set[int]) -> None:
        """Backward pass: neutral nodes and sources run low when all their
        consumers do (``wants``: the types they need). One fp32 reader keeps
        them fp32 (the low readers share a Cast): lowering would hand that
        reader rounded data, e.g. positions above 2048 into a black-listed Sin."""
        low = self.low.onnx_type
        if not wants:
            entry.reason = f"{entry.reason}; no consumer needs another type"
            return
        if wants != {low}:
            entry.reason = f"{entry.reason}; {'consumers need' if low not in wants else 'a consumer needs'} fp32"
            return
        why = "all consumers run low"
        # A source's own value is checked by its consumers' safety rule.
        self._try_low(ctx, i, entry, self._sig(ctx, i), safety=entry.rule != "source")
        if entry.precision is Precision.LOW:
            entry.reason = f"{entry.reason}; {why}"
            for k in entry.low_outputs:
                self.states[ctx.outs[i][k]] = LOW

    # ------------------------------------------------------------- helpers

    def _sig(self, ctx: GraphContext, i: int) -> Signature | None:
        key = (ctx.ops[i], ctx.domains[i])
        if key not in self._sigs:
            op, domain = key
            self._sigs[key] = signature(op, domain, self.opsets.get(opset_domain(domain), 0))
        return self._sigs[key]

    def _is_float_data(self, t: int) -> bool:
        return t == FLOAT or t == self.low.onnx_type


def _stash_in_data_type(op: str, node: onnx.NodeProto) -> bool:
    """A LayerNormalization whose statistics are computed in the data's type (stash_type not 1)."""
    return op == "LayerNormalization" and attribute_int(node, "stash_type", 1) != 1


def _seen_bits(states: set) -> int:
    """The bits (_SEEN_LOW, _SEEN_F32) for the data states reaching a node."""
    return (_SEEN_LOW if LOW in states else 0) | (_SEEN_F32 if F32 in states else 0)


def _output_state(neutral: bool, low: bool) -> str:
    """The data state of a float output: neutral while its node waits for its consumers, else low or fp32."""
    return NEUTRAL if neutral else LOW if low else F32


def _float_slots(ctx: GraphContext, i: int) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(float32 input slots, float32 output slots, some tensor's type unknown)."""
    types = ctx.types
    unknown = False
    sequence = False  # a sequence, map or optional: its element type is not tracked
    ins = []
    for slot, name in enumerate(ctx.ins[i]):
        if name:
            t = types.get(name) or ctx.type_of(name)
            if t == FLOAT:
                ins.append(slot)
            elif t == 0:
                unknown = True
            elif t == NOT_A_TENSOR:
                sequence = True
    outs = []
    for slot, name in enumerate(ctx.outs[i]):
        if name:
            t = types.get(name, 0)
            if t == FLOAT:
                outs.append(slot)
            elif t == 0:
                unknown = True
            elif t == NOT_A_TENSOR:
                sequence = True
    # A float32 tensor going into or coming out of a sequence keeps its type:
    # the sequence on the other side would change type unseen.
    return tuple(ins), tuple(outs), unknown or (sequence and bool(ins or outs))


def list_rule(lists: OpLists, level: str, key: str) -> tuple:
    """Rule 5, the level and the lists: (precision, rule, reason, state) for
    an op (``key``: its name, ``domain::name`` outside the default domain)."""
    if key in lists.black:
        return Precision.FP32, "black-list", f"black list: {lists.black[key]}", _FIXED
    if level == "O3":
        return Precision.LOW, "level", "O3 runs everything low", _FIXED
    if key in lists.white:
        return Precision.LOW, "white-list", f"white list: {lists.white[key]}", _FIXED
    if key in lists.follow or lists.unlisted_follow:
        why = lists.follow.get(key, "unlisted: follows its inputs")
        return Precision.FP32, "follow", f"follow: {why}", _FOLLOW
    if level == "O1":
        return Precision.FP32, "level", "O1: not on the white list", _FIXED
    return Precision.LOW, "level", "O2: not on the black list", _FIXED


def fp32_by_lists(op: str, domain: str, lists: OpLists, level: str) -> bool:
    """Whether rule 5 keeps every node of this op fp32 at ``level``, whatever
    data reaches it (the black list; at O1, an op on no list): the auto search,
    falling back to ``level``, need not try such a node low again. (A source op
    is decided by its consumers before the lists are read.)"""
    default_domain = is_default_domain(domain)
    if default_domain and op in SOURCE_OPS:
        return False
    precision, _, _, state = list_rule(lists, level, op if default_domain else op_key(op, domain))
    return precision is Precision.FP32 and state == _FIXED


def lowered_slots(
    op_type: str,
    domain: str,
    float_ins: tuple[int, ...],
    float_outs: tuple[int, ...],
    sig: Signature | None,
    low: LowDtype,
    opset: int = 0,
) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """Input and output slots that switch to ``low`` when the node runs low,
    or a reason why it cannot.

    Every type variable bound to a float32 tensor switches, if the schema
    admits the low dtype for it; a type variable that does not admit it
    keeps its inputs fp32 (Resize ``scales``), and stops the node if it binds
    an output. Ops without a schema (custom domains the user listed) switch
    all float32 tensors.
    """
    if sig is None:
        return float_ins, float_outs
    if op_type not in SOURCE_OPS:
        # An output whose type variable no float32 input binds is fixed by an
        # attribute (LayerNormalization's Mean/InvStdDev: stash_type): it keeps its type.
        bound = {sig.input_type(s) for s in float_ins}
        float_outs = tuple(s for s in float_outs if sig.output_type(s) not in sig.allowed or sig.output_type(s) in bound)
    for slot in float_outs:
        type_str = sig.output_type(slot) or ""
        if not sig.admits(type_str, low.onnx_type):
            reason = f"schema of {op_type} (opset {sig.since_version}) does not admit {low.name} for output {slot}"
            return reason + _opset_hint(op_type, domain, opset, low)
    low_inputs = tuple(s for s in float_ins if sig.admits(sig.input_type(s) or "", low.onnx_type))
    if not low_inputs and not float_outs:
        reason = f"schema of {op_type} (opset {sig.since_version}) admits no {low.name} input or output"
        return reason + _opset_hint(op_type, domain, opset, low)
    return low_inputs, float_outs


def admitting_opset(op_type: str, domain: str, opset: int, low: LowDtype) -> tuple[int, bool] | None:
    """The first opset after ``opset`` whose schema of the op admits ``low``,
    and whether onnxruntime loads a model at it (None: no such opset)."""
    newer = first_opset_admitting(op_type, domain, opset, low.onnx_type)
    if newer is None:
        return None
    from .ortversions import loads_opset

    return newer, loads_opset(newer)


def _opset_hint(op_type: str, domain: str, opset: int, low: LowDtype) -> str:
    """For a schema's refusal: the opset that admits ``low``, with the
    --target-opset that gets it only where onnxruntime loads that opset (past
    it, the refusal would move from the schema to the runtime)."""
    found = admitting_opset(op_type, domain, opset, low)
    if found is None:
        return ""
    newer, loads = found
    if loads:
        return f"; it does from opset {newer} (--target-opset {newer})"
    import onnxruntime

    from .ortversions import newest_loaded_opset

    newest = newest_loaded_opset(newer)
    return f"; it does from opset {newer}, which onnxruntime {onnxruntime.__version__} does not load (it loads up to {newest})"


def make_plan(
    model: onnx.ModelProto,
    ctx: GraphContext,
    options: ConvertOptions,
    ranges: ConstantRanges,
    calibration: Calibration | None = None,
) -> Plan:
    """Classify every node of ``model`` (indexed and typed in ``ctx``)."""
    return Planner(model, options, options.op_lists(), ranges, calibration).run(ctx)
