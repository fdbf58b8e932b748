"""The conversion pipeline: load -> plan -> rewrite -> clean up -> check.

(Validation, reporting and saving are the CLI's later stages; this module
is what the Python API calls.)
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from .check import CHECK_MODES, check_converted
from .cleanup import clean_up, count_casts, indexed_casts
from .coverage import Coverage, coverage
from .domains import declare_domains
from .dtypes import FLOAT
from .errors import ConversionError, UsageError
from .external import has_external, is_external
from .fold import FoldBatchNormalization
from .graph import GraphContext, NameGenerator, build_context, name_in_use, names_repeat_across_graphs
from .graph_edit import declare_initializers
from .lists import BATCHNORM
from .load import check_calls, check_input_model, check_versions, load_model
from .lower_values import RewriteStats
from .op_profiles import ORT_FUSED
from .op_rules import fp32_by_lists
from .opset import check_target_opset, upgrade_opset
from .options import ConvertOptions, with_fields
from .ortinfer import session_types
from .plan import Plan
from .planner import make_plan
from .rewrite import Rewriter
from .safety import ConstantRanges
from .schema import model_opsets, op_key, opset_domain, signature
from .typeinfo import declared_type, infer_types

if TYPE_CHECKING:  # (calibration runs onnxruntime: its module is loaded where it is used)
    from .auto import AutoResult
    from .calibrate import Calibration
    from .validation import ValidationResult


@dataclass
class ConversionResult:
    """A converted model and everything known about how it was made.

    Unpacks as ``model, plan = convert(...)``.
    """

    model: onnx.ModelProto
    plan: Plan
    options: ConvertOptions
    stats: RewriteStats = field(default_factory=RewriteStats)
    cleanup: dict[str, int] = field(default_factory=dict)
    casts_before: int = 0
    casts_after: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    check_deferred: bool = False  # too large to check in memory: check the written file
    coverage: Coverage | None = None  # the share of float compute the plan runs low, and why the rest is fp32
    validation: ValidationResult | None = None  # level auto: the chosen trial's verdict
    auto: AutoResult | None = None  # level auto: the search

    def __iter__(self) -> Iterator:
        yield self.model
        yield self.plan


class _Timer:
    """Times the stages; tells ``on_stage`` (the CLI's progress line) each one done."""

    def __init__(self, on_stage: Callable[[str], None] | None = None) -> None:
        self.timings: dict[str, float] = {}
        self._t = time.perf_counter()
        self.on_stage = on_stage

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self._t
        self._t = now
        if self.on_stage is not None:
            self.on_stage(stage)


def load_input(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A private copy of the input, checked: the caller's model (or file) is never changed."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        check_versions(copy, "model")
        check_calls(copy, "model")
        if not has_external(copy):  # (external data is checked where it is read: by load_model)
            check_input_model(copy, "model")
        return copy
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    raise TypeError(f"expected an onnx.ModelProto or a path to an .onnx file, got {type(model).__name__}")


def convert(
    model: onnx.ModelProto | str | os.PathLike,
    options: ConvertOptions | None = None,
    *,
    check: str = "full",
    calibration: Calibration | None = None,
    in_place: bool = False,
    external_dir: str | os.PathLike | None = None,
    on_stage: Callable[[str], None] | None = None,
    **option_values,
) -> ConversionResult:
    """Convert an fp32 model to mixed precision.

    ``options`` or keyword arguments (``level="O2", dtype="fp16",
    white_list=[...]``, any :class:`ConvertOptions` field) say how. Returns a
    :class:`ConversionResult`; ``model, plan = convert(...)`` also works.
    ``calibration`` (from :func:`amp_convert.calibrate.calibrate`) turns on
    the calibrated range rule. ``in_place=True`` converts a ModelProto that
    :func:`amp_convert.load.load_model` returned without copying or
    checking it again (the caller gives it up). ``external_dir`` is the
    folder of a model whose external data was left on disk
    (``load_model(path, lazy_external=True)``): tensors are read from there
    one at a time.
    """
    if check not in CHECK_MODES:
        raise UsageError(f"`check` must be one of {', '.join(CHECK_MODES)}, not {check!r}", "check")
    options = convert_options(options, option_values).validated()
    base_dir = Path(external_dir) if external_dir is not None else None
    return _convert(model, options, check, calibration, in_place, base_dir, _Timer(on_stage))


def _convert(
    model,
    options: ConvertOptions,
    check: str,
    calibration: Calibration | None,
    in_place: bool,
    base_dir: Path | None,
    timer: _Timer,
) -> ConversionResult:
    work = model if in_place and isinstance(model, onnx.ModelProto) else load_input(model)
    timer.lap("load")
    notes = declare_domains(work)
    check_target_opset(work, options.target_opset)
    target = max(options.target_opset or 0, _cast_opset(work, options))
    given = work
    work, note = upgrade_opset(work, target, strict=check == "full")
    if note:
        notes.append(note + (f" ({options.low.name} Casts need it)" if target > (options.target_opset or 0) else ""))
        timer.lap("upgrade")
    folded = _fold_batchnorm(work, options)
    if folded:
        notes.append(_fold_note(folded, options.effective_level))
        timer.lap("fold")
    ctx = build_context(work.graph)
    input_casts = indexed_casts(ctx)
    casts_before = len(input_casts) if work is given else count_casts(given)
    timer.lap("index")
    infer_types(ctx, model_opsets(work), assume_float=_assumed_float(options))
    if base_dir is None and _ask_onnxruntime(work, ctx, notes):  # (types it declared: index them again)
        ctx = build_context(work.graph)
        input_casts = indexed_casts(ctx)
        infer_types(ctx, model_opsets(work), assume_float=_assumed_float(options))
    notes.extend(_typing_notes(ctx, model_opsets(work)))
    timer.lap("types")
    if calibration is None and options.safety_on:
        notes.append("calibrated range rule inactive: no reference data")
    ranges = ConstantRanges(clip=options.clip_initializers, base_dir=base_dir)
    plan = make_plan(work, ctx, options, ranges, calibration)
    plan.notes[:0] = notes
    plan.folded = [(bn, conv) for conv, bn in folded]
    covered = coverage(work, plan, ctx, options.op_lists())  # (of the model as planned: the rewrite changes it)
    timer.lap("plan")
    result = ConversionResult(work, plan, options, casts_before=casts_before, casts_after=len(input_casts), coverage=covered)
    if options.effective_level != "O0":
        opset = model_opsets(work).get("")
        rewriter = Rewriter(plan, options.low, options.io_types, NameGenerator(name_in_use(ctx)), base_dir, ranges, opset)
        result.stats = rewriter.run(ctx)
        timer.lap("rewrite")
        if names_repeat_across_graphs(ctx):  # (the clean-up indexes the model again, and looks names up by scope)
            cleaned = clean_up(work)
        else:
            # One type table for the clean-up: the main graph's own (the index is done with), the subgraphs', the rewrite's.
            types = ctx.types
            for c in ctx.walk():
                if c is not ctx:
                    types.update(c.types)
            types.update(rewriter.retyped)
            cleaned = clean_up(work, types)
        result.cleanup = cleaned.counts
        # (the clean-up removes only Casts)
        result.casts_after += result.stats.casts_inserted - len(cleaned.removed)
        if cleaned.removed:
            _mark_removed_casts(plan, input_casts, cleaned.removed)
        if work.ir_version < 4:
            declare_initializers(ctx)
        timer.lap("cleanup")
    # A model read from external data is checked as a file once written: the
    # in-memory checker would need its data, and a serialized copy of it.
    try:
        from_files = base_dir is not None or any(is_external(t) for c in ctx.walk() for t in c.initializers.values())
        result.check_deferred = check != "none" and (from_files or not check_converted(work, check))
    except ConversionError:
        if check == "full" and not in_place:
            # Blame the input when it already fails the full check (strict shape inference).
            source = model if isinstance(model, onnx.ModelProto) else os.fspath(model)
            check_input_model(source, "model" if isinstance(model, onnx.ModelProto) else str(model), full_check=True)
        raise
    timer.lap("check")
    result.timings = timer.timings
    return result


def _fold_batchnorm(model: onnx.ModelProto, options: ConvertOptions) -> list[tuple[str, str]]:
    """Fold the BatchNormalization nodes the level keeps fp32 into the Convs
    before them (:class:`~amp_convert.fold.FoldBatchNormalization`), in
    place; the (Conv, BatchNormalization) label pairs folded.

    The statistics are then applied in fp32 (float64 arithmetic) as the
    level asks, and no Cast pair around a BatchNormalization blocks
    onnxruntime's fusions of the Conv. Left alone: nodes the user names
    (keep_fp32, force_low, keep_fp32_nodes), and folds whose values the low
    dtype cannot hold."""
    level = options.effective_level
    if not options.fold_batchnorm or level == "O0" or not fp32_by_lists(BATCHNORM, "", options.op_lists(), level):
        return []
    named = options.patterns("keep_fp32") + options.patterns("force_low")
    limit = options.low.max

    def skip(label: str) -> bool:
        return label in options.keep_fp32_nodes or any(p.search(label) for p in named)

    def fits(weight, bias) -> bool:
        return float(max(abs(weight).max(initial=0), abs(bias).max(initial=0))) <= limit

    return FoldBatchNormalization(skip, fits)(model).folded


def _fold_note(folded: list[tuple[str, str]], level: str) -> str:
    """The plan's note on the BatchNormalization nodes folded."""
    n = len(folded)
    return (
        f"{n} BatchNormalization node{'s' if n != 1 else ''} folded into the Conv before {'them' if n != 1 else 'it'}, "
        f"in fp32 ({level} keeps BatchNormalization fp32; `fold_batchnorm` false keeps the nodes)"
    )


def _assumed_float(options: ConvertOptions) -> frozenset[str]:
    """The custom-domain ops on the white list, but for onnxruntime's fused
    ops (their schemas type them): listed, they compute in float (see
    :func:`infer_types`)."""
    return frozenset(k for k in options.op_lists().white if "::" in k and k not in ORT_FUSED)


def _untyped_outputs(ctx: GraphContext) -> list[str]:
    """Outputs of the main graph's nodes whose element type nothing gave."""
    types = ctx.types
    return [name for outs in ctx.outs for name in outs if name and not types.get(name)]


def _ask_onnxruntime(model: onnx.ModelProto, ctx: GraphContext, notes: list[str]) -> bool:
    """Where no schema typed a node output, onnxruntime's own inference may:
    the types it gives are declared in ``model`` (value_info). Returns
    whether it declared any."""
    untyped = _untyped_outputs(ctx)
    if not untyped:
        return False
    found = session_types(model, untyped)
    if not found:
        return False
    model.graph.value_info.extend(onnx.helper.make_tensor_value_info(name, t, None) for name, t in found.items())
    shown = ", ".join(sorted(found)[:3]) + (", ..." if len(found) > 3 else "")
    notes.append(f"onnxruntime's own type inference typed {len(found)} tensor(s) no schema could ({shown})")
    return True


def _typing_notes(ctx: GraphContext, opsets: dict[str, int]) -> list[str]:
    """What typed the fused ops' outputs, and what nothing could type."""
    notes = []
    fused = {
        op_key(op, domain): n
        for (op, domain), n in Counter(zip(ctx.ops, ctx.domains, strict=True)).items()
        if (sig := signature(op, domain, opsets.get(opset_domain(domain), 0))) is not None and sig.source == "onnxruntime"
    }
    if fused:
        listed = ", ".join(f"{k} x{n}" for k, n in sorted(fused.items()))
        notes.append(f"onnxruntime's schemas typed the outputs of {sum(fused.values())} node(s) onnx does not define ({listed})")
    untyped = _untyped_outputs(ctx)
    if untyped:
        producer = ctx.producer
        first = untyped[0]
        op = op_key(ctx.ops[producer[first]], ctx.domains[producer[first]]) if first in producer else "?"
        notes.append(
            f"{len(untyped)} tensor(s) have a type that neither onnx's nor onnxruntime's schemas, nor onnxruntime itself, "
            f"determine (first: {first!r}, from {op}): the nodes that read or write them stay fp32"
        )
    return notes


def _cast_opset(model: onnx.ModelProto, options: ConvertOptions) -> int:
    """The default-domain opset the low dtype's Casts need (bf16: 13), where
    the model is below it and the conversion may insert one; else 0. A model
    without a float32 tensor (integer-only) has nothing to convert, and
    keeps its opset: its types are inferred at that opset to know."""
    needed = options.low.min_cast_opset
    # (an upgrade asked for that reaches it makes the answer moot)
    if options.effective_level == "O0" or max(model_opsets(model).get("", 0), options.target_opset or 0) >= needed:
        return 0
    graph = model.graph
    declared = chain(graph.input, graph.value_info, graph.output)
    if FLOAT in map(declared_type, declared) or any(t.data_type == FLOAT for t in graph.initializer):
        return needed  # (the inference starts from what the main graph declares: most models say it there)
    ctx = build_context(graph)
    infer_types(ctx, model_opsets(model), assume_float=_assumed_float(options))
    return needed if any(FLOAT in c.types.values() for c in ctx.walk()) else 0


def _mark_removed_casts(plan: Plan, input_casts: list[tuple[GraphContext, int]], removed: list[onnx.NodeProto]) -> None:
    """The plan's entries of the input's Casts that the clean-up removed
    (they changed nothing), in any graph, say so: the written model has no
    such node. The clean-up names the nodes themselves, which the index
    holds (the Casts the rewrite added have no entry)."""
    gone = set(map(id, removed))
    for c, i in input_casts:
        if id(c.nodes[i]) in gone:
            plan.entries[c.path][i].reason += "; removed by the clean-up: it changed nothing"


def convert_options(options: ConvertOptions | None, option_values: dict) -> ConvertOptions:
    """A call's options: ``options``, or the ConvertOptions fields given as
    keywords (lists as tuples), not both (a UsageError); not yet validated."""
    if options is not None and option_values:
        raise UsageError(f"give `options` or option keywords (`{next(iter(option_values))}`), not both", "options")
    return options or with_fields(ConvertOptions(), _tuples(option_values))


def _tuples(values: dict) -> dict:
    """Lists given to the API become the tuples ConvertOptions stores."""
    out = {}
    for k, v in values.items():
        if isinstance(v, (list, set, frozenset)):
            v = tuple(sorted(v)) if isinstance(v, (set, frozenset)) else tuple(v)
        elif isinstance(v, str) and k in (
            "white_list",
            "black_list",
            "only_white_list",
            "only_black_list",
            "keep_fp32",
            "force_low",
        ):
            v = (v,)
        out[k] = v
    return out
