"""Rewriting: execute a plan on the graph.

* Each float tensor gets at most one version per element type: the Cast that
  makes the fp16 copy of ``x`` is created once, right after ``x``'s producer,
  and shared by every consumer that needs it.
* A low node's float outputs change type in place (names are kept), except
  graph outputs that must keep their type: the node then writes ``y_fp16``
  and a Cast writes ``y``.
* Initializers read only in low precision are stored low; shared ones stay
  fp32 and low readers get a Cast. Values beyond the low dtype's range are
  clipped and counted, tiny ones flushed and counted: never silently. (Not
  counted: those of a constant whose low version no node uses, such as a
  Pad's constant_value outside constant mode, stored low as its schema asks.)
* Source ops that run low get their dtype attribute (Cast ``to``,
  RandomNormal ``dtype`` ...) or their value (Constant, ConstantOfShape)
  rewritten.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .constant_stats import attribute_constant, constant_array, small_raw, value_stats
from .demand import Demand
from .dtypes import FLOAT, TYPE_STR_TO_ELEM, LowDtype
from .external import is_external, read_array
from .graph import GraphContext, NameGenerator
from .graph_edit import cast_node, place_nodes, rename_reads, set_int_attribute
from .lists import DTYPE_AGNOSTIC_INPUTS, DTYPE_ATTRIBUTE_OPS, PASS_THROUGH_ATTRIBUTES, VALUE_ATTRIBUTE_OPS
from .lower_values import RewriteStats, lower_small_tensors, lower_tensor, to_low_array
from .plan import Plan, Precision
from .rewrite_targets import REWRITTEN_OPS, constant_writes, nodes_to_visit, slot_reads
from .safety import ConstantRanges, held_constant, unused_values
from .schema import is_default_domain


class Rewriter:
    """Applies a :class:`Plan` to the graphs indexed by a GraphContext tree."""

    def __init__(
        self,
        plan: Plan,
        low: LowDtype,
        io_types: str,
        names: NameGenerator,
        base_dir: Path | None = None,
        ranges: ConstantRanges | None = None,
        opset: int | None = None,
    ):
        self.plan = plan
        self.fill_holds_low = _fill_holds(low, opset)  # (ConstantOfShape holds bf16 from opset 20 only)
        self.ranges = ranges  # constants' value statistics the planner gathered (external weights are not read again)
        self.low = low
        self.io_low = io_types == "low"
        self.demand = Demand(plan, low, io_types)
        self.names = names
        self.stats = RewriteStats()
        self.retyped: dict[str, int] = {}  # every tensor whose type changed or that is new -> its type
        self.base_dir = base_dir  # folder of the input's external data
        # name -> {element type: name of the tensor holding that version}, per scope: for tensors with
        # a Cast of their own or a renamed graph output (one retyped in place is found in _changed)
        self._versions: dict[str, dict[str, dict[int, str]]] = {}
        self._changed: dict[str, dict[str, int]] = {}  # per scope: tensor -> its new element type
        # Constant values to lower (graph path, output name, tensor), lowered together before their graph's
        # nodes are re-listed; the small ones the facts do not hold (tensor, label, raw bytes) in one batch
        self._constant_values: list[tuple[str, str, onnx.TensorProto]] = []
        self._constants: list[tuple[onnx.TensorProto, str, bytes]] = []
        # per scope: (Casts to put first, Casts to put after node i), filled while its subgraphs are rewritten too
        self._placements: dict[str, tuple[list[onnx.NodeProto], dict[int, list[onnx.NodeProto]]]] = {}
        # (graph path, name) of constants whose low version no node uses (see safety.unused_values)
        self._unused_low: set[tuple[str, str]] = set()

    def run(self, ctx: GraphContext) -> RewriteStats:
        self._rewrite_graph(ctx)
        renamed: set[tuple[str, str]] = set()
        for body in ctx.walk():  # (outer before inner)
            if body.parent is not None:
                self._unshadow(body, renamed)
        self._forget_unused_losses(ctx)
        return self.stats

    def _forget_unused_losses(self, root: GraphContext) -> None:
        """What the low versions of constants no node uses lost changes
        nothing: not reported. The counts go by name, over every graph: a
        name is forgotten only where each graph's constant of that name is
        unused (else what a used one lost would go unsaid)."""
        for name in {name for _, name in self._unused_low}:
            holders = [c.path for c in root.walk() if name in c.initializers or constant_writes(c, name)]
            if all((path, name) in self._unused_low for path in holders):
                self.stats.clipped.pop(name, None)
                self.stats.flushed.pop(name, None)

    # ------------------------------------------------------------------ graph

    def _rewrite_graph(self, ctx: GraphContext) -> None:
        versions: dict[str, dict[int, str]] = {}
        self._versions[ctx.path] = versions
        top: list[onnx.NodeProto] = []  # new nodes (Casts, mostly)
        after: dict[int, list[onnx.NodeProto]] = {}
        self._placements[ctx.path] = (top, after)
        changed: dict[str, int] = {}  # tensor -> new element type (for value_info)
        self._changed[ctx.path] = changed
        low = self.low.onnx_type

        if ctx.parent is None and self.io_low:
            for value in ctx.graph.input:
                if ctx.types.get(value.name) == FLOAT and value.name not in ctx.initializers:
                    value.type.tensor_type.elem_type = low
                    changed[value.name] = low
        batch: list[tuple[onnx.TensorProto, str, bytes]] = []  # small raw ones the facts do not hold, lowered in one pass
        types = ctx.types
        precision, low_ins, low_outs = self.plan.entries[ctx.path].columns()
        reads = slot_reads(ctx, low_ins)
        floats = [name for name in ctx.initializers if types.get(name) == FLOAT]  # (its data type, without reading the proto)
        if self.ranges is not None:  # (gathered by the planner unless its safety rule was off)
            self.ranges.gather(ctx, self.low)
        lowered: list[str] = []
        for name in floats:
            wants = self.demand.requirements(ctx, name)
            read_low, read_f32 = low in wants, bool(wants - {low})
            # (an initializer listed as an input keeps its declared type)
            if read_low and not read_f32 and name not in ctx.input_set:
                lowered.append(name)
            elif read_low:
                self.stats.initializers_shared += 1
                self._share_low(ctx, name, versions)
        self._lower_values(ctx.path, lowered, list(map(ctx.initializers.__getitem__, lowered)), batch)
        changed.update(dict.fromkeys(lowered, low))
        self.stats.initializers_lowered += len(lowered)
        self._lower_batch(batch)

        subgraphs, ops, ins = ctx.subgraphs, ctx.ops, ctx.ins
        # A low node's float outputs change type in place: its readers see them low.
        low_outputs = [outs[k] for slots, outs in zip(low_outs, ctx.outs, strict=True) if slots for k in slots]
        changed.update(dict.fromkeys(low_outputs, low))
        output_producers = {ctx.producer[n] for n in ctx.output_names if n in ctx.producer}
        is_main = ctx.parent is None
        for i in nodes_to_visit(ctx, precision, reads, changed, output_producers):
            low_inputs = low_ins[i]
            agnostic = DTYPE_AGNOSTIC_INPUTS.get(ops[i], ())
            for slot, name in enumerate(ins[i]):
                if not name or slot in agnostic:
                    continue
                t = types.get(name) or ctx.type_of(name)
                if t != FLOAT and t != low:
                    continue
                need = low if slot in low_inputs else t
                if need == changed.get(name, t) and (is_main or ctx.defines(name)):
                    continue  # the tensor itself has the type this input needs
                vs = versions.get(name)
                if vs is None and is_main:  # (its only version is itself, in the type it has now)
                    vs = {changed.get(name, t): name}
                current = vs[need] if vs is not None and need in vs else self._version(ctx, name, need, top, after, known=vs)
                if current != name:
                    ctx.nodes[i].input[slot] = current
            if subgraphs:
                for sub in subgraphs.get(i, ()):
                    self._rewrite_graph(sub)
            if precision[i] is Precision.LOW and ops[i] in REWRITTEN_OPS:
                self._lower_node(ctx.nodes[i], ctx.path)
            if i in output_producers:
                self._fix_graph_outputs(ctx, i, ctx.nodes[i], changed, after)
        self._unused_low.update((ctx.path, name) for name in unused_values(ctx, low_ins))
        if ctx.parent is not None:
            self._fix_passthrough_outputs(ctx, top, after)
            for k in self.demand.low_output_positions(ctx):  # handed on low by its If
                value = ctx.graph.output[k]
                if value.type.HasField("tensor_type"):
                    value.type.tensor_type.elem_type = low
                changed[value.name] = low

        if ctx.parent is None and self.io_low:
            for value in ctx.graph.output:
                if value.type.tensor_type.elem_type == FLOAT:
                    value.type.tensor_type.elem_type = low
                    changed[value.name] = low
        self.retyped.update(changed)
        stale = []  # (entries of names the rewrite gave new tensors: no tensor had them, they would contradict these)
        made = self.names.made
        for k, value in enumerate(ctx.graph.value_info):
            name = value.name
            if name in made:
                stale.append(k)
            elif name in changed and value.type.HasField("tensor_type"):
                value.type.tensor_type.elem_type = changed[name]
        for k in reversed(stale):
            del ctx.graph.value_info[k]
        # Types the planner assumed (outputs of white-listed custom ops) are written down.
        declared = {v.name for v in ctx.graph.value_info} if ctx.assumed_float else ()
        for name in sorted(ctx.assumed_float.difference(declared, ctx.output_names)):
            ctx.graph.value_info.append(helper.make_tensor_value_info(name, changed.get(name, FLOAT), None))
        # Before the nodes are re-listed: re-listing copies them, and these
        # tensors belong to the nodes (and subgraphs) being copied.
        self._lower_constant_values()
        if self.ranges is not None:
            self.ranges.drop_values(ctx.path)
        if top or after:
            place_nodes(ctx, top, after)

    def _share_low(self, ctx: GraphContext, name: str, versions: dict[str, dict[int, str]]) -> None:
        """An initializer read fp32 and low stays fp32; its low readers get a
        Cast, or a low copy (see :meth:`_low_copy`)."""
        tensor = ctx.initializers[name]
        array = read_array(tensor, self.base_dir) if is_external(tensor) else numpy_helper.to_array(tensor)
        copy = self._low_copy(ctx, name, array)
        if copy is not None:
            versions[name] = {FLOAT: name, self.low.onnx_type: copy}

    def _fits_low(self, name: str, array: np.ndarray) -> bool:
        """Whether constant ``name``'s values are within the low dtype's
        range, so a Cast will do; the values that Cast flushes to zero are
        counted."""
        found = value_stats(array)
        if found.abs_max > self.low.max:
            return False
        if found.underflow(self.low):
            self.stats.flushed[name] = self.stats.flushed.get(name, 0) + found.underflow(self.low)
        return True

    def _low_copy(self, ctx: GraphContext, name: str, array: np.ndarray) -> str | None:
        """For the low readers of constant ``name`` (values ``array``) that
        stays fp32: None where a Cast will do, which flushes its tiny values
        to zero at run time (counted here); where it would turn values beyond
        the low dtype's range into Inf, the name of a low copy, clipped and
        counted, added to ``ctx``'s initializers."""
        if self._fits_low(name, array):
            return None
        copy = self._clipped(name, array)
        ctx.graph.initializer.append(copy)
        return copy.name

    def _clipped(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        """Constant ``name``'s values in the low dtype, clipped to its range
        (counted), as a tensor of a new name."""
        low = self.low.onnx_type
        copy = numpy_helper.from_array(to_low_array(array, self.low, name, self.stats), self.names(f"{name}_{_short(low)}"))
        self.retyped[copy.name] = low
        return copy

    def _lower_values(self, scope: str, names: list[str], tensors: list[onnx.TensorProto], batch: list) -> None:
        """Lower constants ``names`` (initializers, or Constant values by
        their outputs' names) of the graph at ``scope``, whose tensors are
        ``tensors``: with their values already converted when gathering the
        constant facts (see :meth:`ConstantRanges.low_values`), else, small
        and raw, in ``batch`` (see :meth:`_lower_batch`), else one by one."""
        found = self.ranges.low_values(scope, names, self.low) if self.ranges is not None else [None] * len(names)
        low, flushed = self.low.onnx_type, self.stats.flushed
        for name, tensor, value in zip(names, tensors, found, strict=True):
            if value is None:
                self._lower_alone(scope, name, tensor, batch)
                continue
            tensor.raw_data, n = value
            tensor.data_type = low
            if n:
                flushed[name] = flushed.get(name, 0) + n

    def _lower_alone(self, scope: str, name: str, tensor: onnx.TensorProto, batch: list) -> None:
        """Lower a constant whose converted values the facts do not hold."""
        raw = small_raw(tensor)
        if raw:
            batch.append((tensor, name, raw))
            return
        external = self.ranges is not None and is_external(tensor)
        known = self.ranges.stats(scope, name, tensor) if external else None
        lower_tensor(tensor, self.low, self.stats, name, self.base_dir, known)

    def _lower_constant_values(self) -> None:
        """Lower the Constant values gathered so far (see :meth:`_lower_values`)."""
        by_scope: dict[str, tuple[list[str], list[onnx.TensorProto]]] = {}
        for scope, name, tensor in self._constant_values:
            names, tensors = by_scope.setdefault(scope, ([], []))
            names.append(name)
            tensors.append(tensor)
        self._constant_values.clear()
        for scope, (names, tensors) in by_scope.items():
            self._lower_values(scope, names, tensors, self._constants)
        self._lower_batch(self._constants)

    def _lower_batch(self, batch: list[tuple[onnx.TensorProto, str, bytes]]) -> None:
        """Lower the (tensor, name, raw bytes) of ``batch`` in one pass, and empty it."""
        if batch:
            tensors, labels, blobs = (list(column) for column in zip(*batch, strict=True))
            lower_small_tensors(tensors, self.low, self.stats, labels, blobs)
            batch.clear()

    def _fix_graph_outputs(self, ctx: GraphContext, i: int, node: onnx.NodeProto, changed: dict, after: dict) -> None:
        """A graph output whose producer now writes another type keeps its
        name and type: the producer writes a renamed tensor, a Cast the output."""
        for k, name in enumerate(node.output):
            if not name or name not in ctx.output_names:
                continue
            current = changed.get(name, ctx.type_of(name))
            wanted = self.demand.output_type(ctx, name)
            if not wanted or current == wanted:
                continue
            renamed = self.names(f"{name}_{_short(current)}")
            node.output[k] = renamed
            changed[renamed], changed[name] = current, wanted
            after.setdefault(i, []).append(self._cast_node(renamed, name, wanted))
            self._versions[ctx.path][name] = {current: renamed, wanted: name}
            self.stats.outputs_renamed.append(name)

    def _fix_passthrough_outputs(self, ctx: GraphContext, top: list, after: dict) -> None:
        """Subgraph outputs that name a value from elsewhere (an outer-scope
        tensor, a body input) get a Cast when that value changed type; body
        outputs bind by position, so the output may take the Cast's name."""
        for value in ctx.graph.output:
            name = value.name
            if name in ctx.producer:
                continue
            vs = self._lookup(ctx, name)
            wanted = self.demand.output_type(ctx, name)
            if vs is None or wanted in vs or not wanted:
                continue
            value.name = self._version(ctx, name, wanted, top, after, hoist=False)

    def _unshadow(self, body: GraphContext, renamed: set[tuple[str, str]]) -> None:
        """A body's initializer named as a value of an outer scope, which the
        conversion gave another type than that value, takes a name of its
        own (in the body, and in the bodies within that read it): onnx's
        type inference takes the outer value's type for the inner name and
        refuses the body. ``renamed``: (graph path, name) of the outer
        initializers renamed so far (the value seen outside is then the one
        further out)."""
        for name, tensor in body.initializers.items():
            outer = _outer_scope(body, name)
            while outer is not None and (outer.path, name) in renamed:
                outer = _outer_scope(outer, name)
            if outer is None or self._final_type(body, name) == self._final_type(outer, name):
                continue
            tensor.name = own = self.names(name)
            self.retyped[own] = self._final_type(body, name)
            renamed.add((body.path, name))
            rename_reads(body.graph, name, own)

    def _final_type(self, ctx: GraphContext, name: str) -> int:
        """The element type of ``name``, defined in ``ctx``, once rewritten."""
        return self._changed[ctx.path].get(name) or ctx.types.get(name, 0)

    # ---------------------------------------------------------------- versions

    def _lookup(self, ctx: GraphContext, name: str) -> dict[int, str] | None:
        """The versions of ``name`` (from the scope defining it), or None if
        it has only itself, of its own type."""
        scope: GraphContext | None = ctx
        while scope is not None:
            vs = self._versions.get(scope.path, {}).get(name)
            if vs is not None:
                return vs
            retyped = self._changed.get(scope.path, {}).get(name)
            if retyped is not None:  # (retyped in place: it is its only version)
                return {retyped: name}
            if scope.defines(name):
                return None
            scope = scope.parent
        return None

    def _version(
        self, ctx: GraphContext, name: str, need: int, top: list, after: dict, hoist: bool = True, known: dict | None = None
    ) -> str:
        """Name of ``name``'s version in element type ``need``, creating the
        (shared) Cast the first time it is asked for. ``hoist=False`` keeps a
        captured value's Cast in ``ctx`` (a body output must be made there).
        ``known``: its versions, when the caller has them at hand."""
        vs = known if known is not None else self._lookup(ctx, name)
        if vs is None:
            vs = {ctx.type_of(name): name}
        if need in vs:
            return vs[need]
        # A value captured from an outer scope is cast there, once: not once
        # per branch, and not on every iteration of a Loop body.
        home = ctx if ctx.parent is None or not hoist or ctx.defines(name) else (ctx.scope_of(name) or ctx)
        if home is not ctx:
            top, after = self._placements[home.path]
        producer = home.producer.get(name)
        if producer is not None and need == self.low.onnx_type and home.ops[producer] in VALUE_ATTRIBUTE_OPS:
            copy = self._constant_copy(home, producer, name, after)
            if copy is not None:
                self._versions[home.path][name] = {**vs, need: copy}
                return copy
        source = vs.get(FLOAT) or next(iter(vs.values()))
        target = self.names(f"{name}_{_short(need)}")
        cast = self._cast_node(source, target, need)
        if producer is not None:
            after.setdefault(producer, []).append(cast)
        else:  # graph input or initializer (or a name no scope defines)
            top.append(cast)
        self._versions[home.path][name] = {**vs, need: target}
        return target

    def _constant_copy(self, ctx: GraphContext, i: int, name: str, after: dict) -> str | None:
        """The low copy (see :meth:`_low_copy`) of the fp32 value of Constant
        node ``i``, which writes ``name``, as an initializer has. For a
        ConstantOfShape whose fill value is beyond the low range, the copy
        is a second ConstantOfShape (of the same shape), filled with it
        clipped (``after``: where it is placed, after node ``i``)."""
        node = ctx.nodes[i]
        found = attribute_constant(node, name) if is_default_domain(ctx.domains[i]) else None
        if found is None:
            return None
        array = constant_array(found[1], self.base_dir)
        if ctx.ops[i] == "Constant":
            return self._low_copy(ctx, name, array)
        if self._fits_low(name, array):
            return None
        value = self._clipped(name, array)
        if self.fill_holds_low:
            fill = helper.make_node(
                "ConstantOfShape", [node.input[0]], [value.name], name=self.names(f"{value.name}_fill"), value=value
            )
            after.setdefault(i, []).append(fill)
            return value.name
        # The clipped fill in float32 (exact: it is a low value), cast to the low dtype.
        wide = numpy_helper.from_array(numpy_helper.to_array(value).astype(np.float32), self.names(f"{name}_clipped"))
        self.retyped[wide.name] = FLOAT
        fill = helper.make_node("ConstantOfShape", [node.input[0]], [wide.name], name=self.names(f"{wide.name}_fill"), value=wide)
        after.setdefault(i, []).extend([fill, self._cast_node(wide.name, value.name, self.low.onnx_type)])
        return value.name

    def _cast_node(self, source: str, target: str, to: int) -> onnx.NodeProto:
        self.retyped[target] = to
        self.stats.casts_inserted += 1
        return cast_node(source, target, to, self.names(f"{target}_cast"))

    # -------------------------------------------------------------- node body

    def _lower_node(self, node: onnx.NodeProto, scope: str) -> None:
        """Rewrite the attributes that fix a low node's output type."""
        if not is_default_domain(node.domain):
            return
        op = node.op_type
        low = self.low.onnx_type
        if op in DTYPE_ATTRIBUTE_OPS:
            set_int_attribute(node, DTYPE_ATTRIBUTE_OPS[op], low)
            self.stats.attributes_rewritten += 1
        elif op == "Constant":
            self._lower_constant(node, scope)
        elif op == "ConstantOfShape":
            for a in node.attribute:
                if a.name == "value":
                    lower_tensor(a.t, self.low, self.stats, node.output[0], self.base_dir)
                    break
            else:
                node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, self.low.numpy))))
            self.stats.constants_lowered += 1
        elif op in PASS_THROUGH_ATTRIBUTES:
            self._lower_held(node)

    def _lower_held(self, node: onnx.NodeProto) -> None:
        """A low node uses the value it holds (see :func:`held_constant`) in
        the low dtype: what that flushes is counted, as for the constants
        the rewrite lowers, and a value beyond the range is clipped and
        counted (onnxruntime would make it Inf)."""
        held = held_constant(node)
        if held is None:
            return
        attribute = PASS_THROUGH_ATTRIBUTES[node.op_type]
        value = numpy_helper.to_array(held).reshape(1)
        low_value = to_low_array(value, self.low, f"{node.name or node.output[0]}.{attribute}", self.stats)
        if np.isfinite(value[0]) and abs(value[0]) > self.low.max:
            for a in node.attribute:
                if a.name == attribute:
                    a.f = float(low_value[0])
            self.stats.attributes_rewritten += 1

    def _lower_constant(self, node: onnx.NodeProto, scope: str) -> None:
        for idx, a in enumerate(node.attribute):
            if a.name == "value":
                self._constant_values.append((scope, node.output[0], a.t))
            elif a.name in ("value_float", "value_floats"):
                values = np.array(a.f if a.name == "value_float" else list(a.floats), dtype=np.float32)
                tensor = numpy_helper.from_array(to_low_array(values, self.low, node.output[0], self.stats))
                del node.attribute[idx]
                node.attribute.append(helper.make_attribute("value", tensor))
            else:
                continue
            self.stats.constants_lowered += 1
            return


def _outer_scope(ctx: GraphContext, name: str) -> GraphContext | None:
    """The innermost graph outside ``ctx`` that defines ``name``."""
    return ctx.parent.scope_of(name) if ctx.parent is not None else None


_SHORT_NAMES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


def _short(elem_type: int) -> str:
    short = _SHORT_NAMES.get(elem_type)
    return short if short is not None else onnx.TensorProto.DataType.Name(elem_type).lower()


def _fill_holds(low: LowDtype, opset: int | None) -> bool:
    """Whether ConstantOfShape, at the default-domain ``opset`` (None: the
    newest), admits a ``low`` fill value."""
    try:
        schema = onnx.defs.get_schema("ConstantOfShape", opset or onnx.defs.onnx_opset_version())
    except onnx.defs.SchemaError:  # (before opset 9: no ConstantOfShape, so no fill to make)
        return False
    allowed = (t for c in schema.type_constraints if c.type_param_str == "T2" for t in c.allowed_type_strs)
    return any(TYPE_STR_TO_ELEM.get(t) == low.onnx_type for t in allowed)
