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

from typing import TYPE_CHECKING

import onnx

from .availability import KernelRule
from .demand import Demand
from .dtypes import FLOAT, LowDtype
from .graph import GraphContext, cast_to, check_utf8
from .lists import CONTROL_FLOW_OPS, NO_LOW_KERNEL_OPS, ORT_QUANTIZED_OPS, QUANTIZED_OPS, SOURCE_OPS, OpLists
from .op_rules import (
    FIXED,
    FOLLOW,
    LOW,
    NEUTRAL,
    SEEN_F32,
    SEEN_LOW,
    SHAPE_READERS,
    SOURCE,
    admitting_opset,
    float_slots,
    list_rule,
    lowered_slots,
    output_state,
    seen_bits,
    stash_in_data_type,
)
from .options import ConvertOptions
from .plan import GraphEntries, Plan, PlanEntry, Precision
from .safety import ConstantRanges, data_range_problem
from .schema import DEFAULT_DOMAINS, Signature, is_default_domain, model_opsets, op_key, opset_domain, signature

if TYPE_CHECKING:  # (calibration runs onnxruntime: its module is loaded where it is used)
    from .calibrate import Calibration


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
            f"{self.low.name} for them; `target_opset` {max(later.values())} upgrades the model to one whose schemas do"
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
        floats = [float_slots(ctx, i) for i in range(len(ctx.nodes))]
        self._float_slots = floats
        pending: list[int] = []  # neutral follow nodes and sources, resolved backwards
        subgraphs = ctx.subgraphs
        if self.constants_rule:
            self.ranges.gather(ctx, self.low)
        for i in range(len(ctx.nodes)):
            entry, state = self._classify(ctx, i, entries.label(i))
            entries.add(entry)
            if state == FOLLOW and not self._resolve_follow(ctx, i, entry):
                state = NEUTRAL
            if state in (NEUTRAL, SOURCE):
                pending.append(i)
            if i in subgraphs:  # bodies are planned where they run: outer values they read have their states
                for sub in subgraphs[i]:
                    self._plan_graph(sub)
                self._float_slots, self._has_qdq = floats, has_qdq
                if ctx.ops[i] == "If" and entry.rule == "control-flow":
                    self._lower_if_outputs(ctx, i, entry)
            self._record_output_states(ctx, i, entry.precision, entry.low_outputs, neutral=state in (NEUTRAL, SOURCE))
        for i in reversed(pending):
            self._resolve_pending(ctx, i, entries)

    def _seen_states(self, ctx: GraphContext, i: int) -> int:
        """Which data states reach node ``i`` (bits SEEN_LOW, SEEN_F32), as the follow rule sees them."""
        return seen_bits(set(map(self.states.get, ctx.ins[i])))

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
        if self._by_kind and op != "Cast" and not stash_in_data_type(op, node):
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
                return Precision.FP32, "quantized", f"part of a QDQ-quantized computation ({where}): never touched", FIXED
        if op == "Constant" and any(a.name == "sparse_value" for a in node.attribute):
            return Precision.FP32, "sparse-constant", "a sparse Constant value is left as it is", FIXED
        return None

    def _apply_rules(self, ctx: GraphContext, i: int, node: onnx.NodeProto, op: str, domain: str, label: str) -> tuple:
        default_domain = domain in DEFAULT_DOMAINS
        key = op if default_domain else op_key(op, domain)
        if default_domain and op in CONTROL_FLOW_OPS:
            return Precision.FP32, "control-flow", "keeps its interface types; its bodies are converted", FIXED
        float_ins, float_outs, unknown = self._float_slots[i]
        if not float_ins and not float_outs:
            return Precision.UNCHANGED, "no-float32", "no float32 tensors (integer, bool or already low)", FIXED
        if self.level == "O0":
            return Precision.FP32, "level", "O0 changes nothing", FIXED
        if default_domain and op in QUANTIZED_OPS:
            return Precision.FP32, "quantized", "quantized computation is never touched", FIXED
        if key in ORT_QUANTIZED_OPS:
            return Precision.FP32, "quantized", f"{key} is onnxruntime's quantized op: never touched", FIXED
        if default_domain and op == "Cast" and cast_to(node) != FLOAT:
            return Precision.UNCHANGED, "cast", "Cast to a non-float32 type reads any float version", FIXED
        if default_domain and op in SHAPE_READERS and not float_outs and SHAPE_READERS[op].issuperset(float_ins):
            why = f"{op} reads only the shape of its float input: it computes in no float type"
            return Precision.UNCHANGED, "shape-only", why, FIXED
        if unknown:
            return Precision.FP32, "unknown-type", "a tensor's type is unknown (or it is a sequence); left as it is", FIXED
        if default_domain and self._sig(ctx, i) is None:
            return Precision.FP32, "schema", f"no schema for {op} at this opset", FIXED
        if (domain, op) in self.local_functions:  # (whatever the lists say: low inputs would not fit its fp32 body)
            why = f"calls the model's local function {key}, whose body is left as it is: it reads and writes fp32"
            return Precision.FP32, "local-function", why, FIXED
        if not default_domain and not self._listed(key) and not self._forced(label):
            return Precision.FP32, "custom-domain", f"custom-domain op {key}: fp32 unless on the white list", FIXED
        for pattern in self.keep_patterns:
            if pattern.search(label):
                return Precision.FP32, "user-keep-fp32", f"`keep_fp32` {pattern.pattern!r}", FIXED
        if label in self.keep_names:
            return Precision.FP32, "auto-keep-fp32", "auto search: kept fp32 (it added error)", FIXED
        for pattern in self.force_patterns:
            if pattern.search(label):
                return Precision.LOW, "user-force-low", f"`force_low` {pattern.pattern!r}", FIXED
        if label in self.force_names:
            return Precision.LOW, "auto-force-low", "auto search: runs low within tolerance", FIXED
        if default_domain and op in SOURCE_OPS:
            return Precision.FP32, "source", "creates float data: takes the precision its consumers need", SOURCE
        if default_domain and stash_in_data_type(op, node) and self.level != "O3" and key in self.lists.follow:
            why = "stash_type 0: its mean and variance are computed in the data's type, not float32"
            return Precision.FP32, "stash-type", why, FIXED
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
        if seen == SEEN_F32:
            entry.reason = f"{entry.reason}; its inputs are fp32"
        elif seen == SEEN_LOW or self.level != "O1":
            mixed = "mixed fp32/low inputs" if seen == SEEN_LOW | SEEN_F32 else "its inputs are low"
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
                states[name] = output_state(neutral, t != FLOAT or k in low_outputs)

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


def make_plan(
    model: onnx.ModelProto,
    ctx: GraphContext,
    options: ConvertOptions,
    ranges: ConstantRanges,
    calibration: Calibration | None = None,
) -> Plan:
    """Classify every node of ``model`` (indexed and typed in ``ctx``)."""
    return Planner(model, options, options.op_lists(), ranges, calibration).run(ctx)
