"""Validation: run the fp32 model and the converted one on the same samples
and measure how far apart they are, per output and per node.

Both models run with their intermediate tensors exposed (node output names
are preserved by the converter), one sample at a time; only running sums are
kept, so memory stays at one sample's tensors whatever the sample count.

A reference that is itself low precision (re-converting a converted model,
or comparing two) is decided the way the candidate is: through its emulation
twin where the provider cannot run it as is (bf16 on CPU; bf16 graph inputs
or outputs anywhere) or would not round between ops (fp16 on CPU), and as a
fallback when its real run cannot load. Each model is fed the samples cast
to the dtypes its own inputs declare; outputs compare in float64, those that
are sequences element by element (``out[0]``, ... in the reports: see
:mod:`amp_convert.metrics`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto

from .as_written import AsWritten, PendingAsWritten
from .branch_runs import if_branches
from .calibrate import Calibration
from .dtypes import FLOAT_TYPES
from .emulate import decide_emulation, emulation_twin, low_dtype_of, low_inputs, low_io
from .errors import AmpError, InternalError, LoadFailure, ModelFailure, NeitherLoads, RefusedAsWritten, TwinFailure
from .graph import build_context, tensor_names
from .inputs import CandidateInputs, InputSource
from .metrics import ErrorStats
from .offenders import node_errors
from .options import EMULATE_MODES
from .output_types import holds_sequence, map_value_dtype, value_kind
from .pin import Selection, find_selections, makes, pin
from .plan import Plan
from .runner import TWIN_DISABLED_OPTIMIZERS, Runnable, choose_provider, input_dtypes, runnable, value_bytes
from .safety import unused_values
from .schema import model_opsets
from .segments import PartModel, can_split, node_order, run_in_parts, typed_throughout, worth_splitting
from .sequence_stats import SequenceStats
from .tolerance import DEFAULT_TOLERANCES, per_output_tolerances
from .typeinfo import infer_types
from .validation_result import PinnedSelection, ValidationConfig, ValidationResult

# Exposing every tensor makes onnxruntime's session set-up grow faster than
# the graph: above this many, the per-node diff is off unless asked for.
PER_NODE_LIMIT = 20_000


class Validator:
    """Validates candidates against one reference model and one input source.

    Reused across candidates (the auto search), it keeps the reference's
    type index and, when the reference outputs of all samples are small
    (``cache_bytes``), those outputs, so each trial runs only the candidate.
    A ``calibration`` of the reference lends its session (every float tensor
    exposed) and, when it ran on these very samples, its outputs.
    """

    def __init__(
        self,
        reference: onnx.ModelProto,
        source: InputSource,
        config: ValidationConfig,
        cache_bytes: int = 64 << 20,
        base_dir: str | os.PathLike | None = None,
        calibration: Calibration | None = None,
    ):
        if config.emulate not in EMULATE_MODES:
            raise AmpError(f"unknown emulation mode {config.emulate!r}: use auto, always or never")
        self.reference = reference
        self.source = source
        self.config = config
        self.provider, self.provider_note = choose_provider(config.provider)
        self.ref_ctx = _typed(reference)
        self.output_names = [v.name for v in reference.graph.output]
        self.sequence_outputs = {v.name for v in reference.graph.output if holds_sequence(v.type)}
        self.map_values = {v.name: map_value_dtype(v.type) for v in reference.graph.output}
        self.output_kinds = [value_kind(v.type) for v in reference.graph.output]
        self.cache_bytes = cache_bytes
        # (feeds, outputs) per sample of this source, when a calibration ran on the same samples
        known = calibration.outputs if calibration is not None and calibration.source is source else None
        self._outputs_cache = known
        # Bytes per sample of the tensors calibration measured (float32), to cut parts by (segments.py).
        self._sizes = {n: r.size * 4 for n, r in calibration.ranges.items()} if calibration is not None else {}
        self.base_dir = base_dir  # folder of external data the models still refer to
        self._plain_session: Runnable | None = None
        # A low-precision reference runs as the candidate would (decided here: --emulate never
        # with a reference the provider cannot run is an error before anything runs).
        self.ref_low = low_dtype_of(self.ref_ctx, reference.functions)
        self.reference_emulated, self.reference_note = decide_emulation(
            config.emulate, self.provider, self.ref_low, low_io(reference), role="reference"
        )
        self._reference_twin: onnx.ModelProto | None = None
        # The calibration run's session of this reference (every float tensor exposed), if it ran as we would.
        shared = calibration is not None and calibration.session is not None and calibration.provider == self.provider
        shared = shared and calibration.session.emulated == self.reference_emulated
        self._shared: tuple[Runnable, frozenset[str]] | None = (calibration.session, calibration.exposed) if shared else None
        # Choices the candidate reads from the reference (pin.py), and the values they are made from.
        self.selections = find_selections(self.ref_ctx) if config.pin_choices else []
        self._extras = [(s.name, TensorProto.INT64) for s in self.selections]
        self._extras += [(n, self.ref_ctx.type_of(n)) for n in dict.fromkeys(n for s in self.selections for n in s.inputs)]
        # The main graph's If conditions, read from each reference run: which branches ran.
        inputs = set(self.ref_ctx.input_names)
        self._extras += [(b.condition, TensorProto.BOOL) for b in if_branches(self.ref_ctx) if b.condition not in inputs]
        if self._extras and known and any(n not in known[0][1] for n, _ in self._extras):
            self._outputs_cache = None  # (calibration's runs did not keep the choices)

    def check(
        self,
        candidate: onnx.ModelProto,
        plan: Plan | None = None,
        per_node: bool | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ValidationResult:
        """Compare ``candidate`` with the reference on every sample."""
        config = self.config if per_node is None else replace(self.config, per_node=per_node)
        cand_ctx = _typed(candidate)
        pins = [s for s in self.selections if makes(cand_ctx, s)]
        with self._loading_as_written(candidate, cand_ctx, config) as written:
            why = None
            try:
                result = self._check(candidate, cand_ctx, config, plan, progress, pins, written)
            except ModelFailure as e:
                # Only the pinned candidate's own failure may go with its pins: the
                # reference and every check but the candidate's run are the same without them.
                if not pins or e.role != "candidate":
                    raise
                why = str(e)[:160]
            if why is not None:
                # The pinned candidate failed to load or run (e.g. a choice it cannot take): compare as it is.
                result = self._check(candidate, cand_ctx, config, plan, progress, [], written)
                result.pin_note = f"choices not pinned: the pinned candidate failed ({why})"
            result.kernel_note = self._written_result(written).note if written is not None else ""
            return result

    @contextlib.contextmanager
    def _loading_as_written(
        self, candidate: onnx.ModelProto, cand_ctx, config: ValidationConfig
    ) -> Iterator[PendingAsWritten | None]:
        """The candidate's load as written (:meth:`as_written`; None where
        ``config`` skips it or the candidate is not low precision), running
        while the block validates; its refusal is what the block raises,
        ahead of any error the block meets meanwhile. Where validation runs
        in parts, memory is the bound: the load is waited for first."""
        written = self._load_as_written(candidate, cand_ctx) if config.load_check else None
        if written is None:
            yield None
            return
        with written:
            if worth_splitting(self.reference, config.part_bytes):
                self._written_result(written)
            try:
                yield written
            except AmpError as e:
                if not isinstance(e, RefusedAsWritten):  # (not the refusal itself, already handled)
                    self._written_result(written)
                raise

    def _check(
        self,
        candidate: onnx.ModelProto,
        cand_ctx,
        config: ValidationConfig,
        plan: Plan | None,
        progress: Callable[[int], None] | None,
        pins: list[Selection],
        written: PendingAsWritten | None,
    ) -> ValidationResult:
        start = time.perf_counter()
        cand_low = low_dtype_of(cand_ctx, candidate.functions)
        dtype = config.dtype or _low_key(cand_low)  # (a model holding a few bf16 tensors converted to fp16 is judged as fp16)
        tolerance = config.tolerance or DEFAULT_TOLERANCES[dtype]
        cand_outputs = [v.name for v in candidate.graph.output]
        if self.output_names != cand_outputs:
            raise AmpError(f"the models' outputs differ: {self.output_names} vs {cand_outputs}")
        per_output = per_output_tolerances(tolerance, config.tolerances, self.output_names)
        for name, ref_kind, cand_out in zip(self.output_names, self.output_kinds, candidate.graph.output, strict=True):
            cand_kind = value_kind(cand_out.type)
            if ref_kind and cand_kind and ref_kind != cand_kind:
                raise AmpError(
                    f"the models' outputs differ: {name!r} is {ref_kind} in the reference but {cand_kind} in the candidate"
                )
        cand_inputs = CandidateInputs(self.source.specs, candidate)

        tensors: list[str] = []
        per_node_note = ""
        if config.per_node is not False:
            ref_ctx = self.ref_ctx
            unused = unused_values(ref_ctx)  # (a Pad's constant_value outside constant mode: stored low, maybe clipped)
            tensors = [
                name
                for node in ref_ctx.nodes
                for name in node.output
                if name
                and name not in unused
                and ref_ctx.types.get(name) in FLOAT_TYPES
                and name in cand_ctx.producer
                and cand_ctx.types.get(name) in FLOAT_TYPES
                and name not in self.output_names
            ]
            if config.per_node is None and len(tensors) > PER_NODE_LIMIT:
                per_node_note = f"per-node diff skipped: {len(tensors)} tensors (over {PER_NODE_LIMIT}); `per_node` forces it"
                tensors = []
        per_node = bool(tensors) or (config.per_node is not False and not per_node_note)
        # Through the emulation twin when the provider calls for it, or (auto) when the real
        # low-precision run cannot load (e.g. a bf16 kernel missing on CUDA).
        judged = [n for s in pins for n in s.inputs if n in cand_ctx.producer and cand_ctx.types.get(n) in FLOAT_TYPES]
        judged = list(dict.fromkeys(judged))
        exposed = [(n, cand_ctx.types[n]) for n in dict.fromkeys([*tensors, *judged])]
        split = self._split(candidate, cand_low, config, pins)
        if split is None:
            run_model, own = pin(candidate, pins, tensor_names(cand_ctx)) if pins else (candidate, {})
            cand = self._candidate_session(run_model, cand_low, config.emulate, exposed, written)
            emulated, emulation_note = cand.emulated, cand.note
        else:
            emulated, emulation_note = split[2], split[3]
        taken = set(self.output_names)  # (the report's row names: an element's never takes an output's)
        # (an output judged by its median or a quantile keeps what an exact one needs)
        ordered = {n for n in self.output_names if per_output.get(n, tolerance).error_stat in ("median", "quantile")}
        out_stats = {
            n: SequenceStats(n, taken, self.map_values[n], n in ordered)
            if n in self.sequence_outputs
            else ErrorStats(n, map_values=self.map_values[n], quantiles=n in ordered)
            for n in self.output_names
        }
        tensor_stats = {n: ErrorStats(n, detailed=False) for n in tensors}
        agreement = {s.name: ErrorStats(s.name) for s in pins}
        judged_stats = {n: ErrorStats(n) for n in judged}
        branches = if_branches(self.ref_ctx) if split is None else []
        samples = 0
        if split is not None:
            samples = self._run_split(split[0], split[1], tensors, cand_inputs, {**tensor_stats, **out_stats}, config)
            if progress:
                for _ in range(samples):
                    progress(1)
        for feeds, ref_values in self._reference_runs(tensors) if split is None else ():
            cand_inputs.check(feeds)
            # the samples cast to the dtypes the candidate's inputs declare, and the reference's choices
            cand_values = cand.run({**feeds, **{s.name: ref_values[s.name] for s in pins}})
            for name, stats in out_stats.items():
                stats.update(ref_values[name], cand_values[name])
            for name, stats in tensor_stats.items():
                stats.update(ref_values[name], cand_values[name])
            for name, stats in agreement.items():
                stats.update(ref_values[name], cand_values[own[name]])
            for name, stats in judged_stats.items():
                stats.update(ref_values[name], cand_values[name])
            if branches:
                run = {**feeds, **ref_values}  # (a condition may be a graph input)
                for runs in branches:
                    runs.record(run)
            del cand_values
            samples += 1
            if progress:
                progress(1)
        result = ValidationResult(
            self.provider,
            self.provider_note,
            emulated,
            emulation_note,
            dtype,
            tolerance,
            samples,
            [r for name, s in out_stats.items() for r in s.records(per_output.get(name, tolerance))],
            top=config.top,
            per_node_note=per_node_note,
            reference_emulated=self.reference_emulated,
            reference_emulation_note=self.reference_note,
            pinned=[PinnedSelection(s, agreement[s.name]) for s in pins],
            selection_inputs=list(judged_stats.values()),
            per_output=per_output,
            branches=branches,
        )
        if per_node:
            failing = {o.name.split("[", 1)[0] for o in result.outputs if o.verdict(result.tolerance_for(o.name))}
            stats = {**tensor_stats, **out_stats}
            result.nodes = node_errors(self.ref_ctx, cand_ctx, stats, plan, dtype, failing or set(self.output_names))
        result.seconds = time.perf_counter() - start
        return result

    def _split(
        self, candidate: onnx.ModelProto, cand_low: int | None, config: ValidationConfig, pins: list[Selection]
    ) -> tuple[PartModel | None, PartModel, bool, str] | None:
        """The reference (None where its outputs are cached and no tensor is
        compared: see :meth:`_run_split`) and the candidate as parts run
        them (:mod:`amp_convert.segments`), the candidate's emulation and
        why; None where they run whole: the reference's weights are within
        ``part_bytes``, a graph cannot be cut, choices are pinned, or a
        low-precision model runs as written (its cut values may be bf16, and
        its fallback to the emulation is :func:`~amp_convert.runner.runnable`'s)."""
        if pins or self._extras or not worth_splitting(self.reference, config.part_bytes) or not can_split(candidate):
            return None
        emulated, note = decide_emulation(config.emulate, self.provider, cand_low, low_io(candidate))
        if (cand_low is not None and not emulated) or (self.ref_low is not None and not self.reference_emulated):
            return None
        cand = emulation_twin(candidate, self.base_dir) if emulated else candidate
        ref = self.reference
        if self.reference_emulated:
            self._reference_twin = self._reference_twin or emulation_twin(ref, self.base_dir)
            ref = self._reference_twin
        ref_types, cand_types = _typed(ref).types, _typed(cand).types
        if not (typed_throughout(ref, ref_types) and typed_throughout(cand, cand_types)):
            return None
        return (
            self._parts(ref, ref_types, "reference", self.reference_emulated, self.reference),
            self._parts(cand, cand_types, "candidate", emulated, candidate),
            emulated,
            note,
        )

    def _parts(
        self, run_model: onnx.ModelProto, types: dict[str, int], role: str, emulated: bool, model: onnx.ModelProto
    ) -> PartModel:
        """``run_model`` (``model`` or its twin, if ``emulated``; ``types``: its element types) as parts run it."""
        return PartModel(
            run_model,
            types,
            self.provider,
            self.base_dir,
            role,
            TWIN_DISABLED_OPTIMIZERS if emulated else (),
            input_dtypes(run_model),
            low_inputs(model) if emulated else {},
        )

    def _run_split(
        self,
        ref: PartModel,
        cand: PartModel,
        tensors: list[str],
        cand_inputs: CandidateInputs,
        stats: dict[str, ErrorStats],
        config: ValidationConfig,
    ) -> int:
        """Run the reference and the candidate part by part on every sample,
        the compared values of each part meeting in ``stats``; returns the
        number of samples. Without ``tensors`` the reference's outputs are
        read from, or kept in, the outputs cache."""
        samples = list(self.source)
        for feeds in samples:
            cand_inputs.check(feeds)
        cached = self._outputs_cache if not tensors else None
        kept: list[dict] | None = [{} for _ in samples] if not tensors and cached is None else None
        compared: set[str] = set()
        held = 0

        def consume(i: int, values: list[dict]) -> None:
            nonlocal kept, held
            ref_values = cached[i][1] if cached is not None else values[0]
            for name, value in values[-1].items():
                stats[name].update(ref_values[name], value)
                compared.add(name)
            if kept is not None:  # (copied: a returned array can hold its part's whole arena alive)
                kept[i].update({name: np.array(v) for name, v in values[0].items()})
                held += sum(value_bytes(v) for v in values[0].values())
                if held > self.cache_bytes:
                    kept = None

        order, reach = node_order(self.reference)
        models = [cand] if cached is not None else [ref, cand]
        wanted = [*tensors, *self.output_names]
        run_in_parts(models, wanted, samples, consume, order=order, reach=reach, known=self._sizes, part_bytes=config.part_bytes)
        missed = [name for name in dict.fromkeys(wanted) if name in order and name in stats and name not in compared]
        if missed and samples:  # (a verdict on values never compared would be a pass on nothing)
            raise InternalError(f"validation in parts compared no value of {', '.join(map(repr, missed[:5]))}")
        if kept is not None:
            self._outputs_cache = list(zip(samples, kept, strict=True))
        return len(samples)

    def as_written(self, candidate: onnx.ModelProto, cand_ctx=None) -> AsWritten | None:
        """What onnxruntime makes of ``candidate`` (``cand_ctx``: its typed
        context, if built) as written, on this validator's provider, where
        it is low precision (None where it is not: it runs as written).
        Validation runs its emulation twin, or a copy exposing its tensors,
        and would pass a model that onnxruntime refuses: such a refusal is a
        :class:`RefusedAsWritten` (raised after the reference is loaded, as
        in :meth:`_reference_loads`); a kernel the CPU provider lacks, for a
        model aimed at another, the result's note (see
        :class:`amp_convert.as_written.PendingAsWritten`). :meth:`check` asks
        it too, its child process loading the model while validation runs."""
        written = self._load_as_written(candidate, cand_ctx)
        if written is None:
            return None
        with written:
            return self._written_result(written)

    def _load_as_written(self, candidate: onnx.ModelProto, cand_ctx=None) -> PendingAsWritten | None:
        """:meth:`as_written`, started (None where the candidate is not low precision)."""
        low = low_dtype_of(cand_ctx if cand_ctx is not None else _typed(candidate), candidate.functions)
        if low is None:
            return None
        emulated, _ = decide_emulation(self.config.emulate, self.provider, low, low_io(candidate))
        return PendingAsWritten(candidate, low, self.provider, emulated, self.base_dir, aimed_at=self.config.target_provider)

    def _written_result(self, written: PendingAsWritten) -> AsWritten:
        """``written``'s result; its refusal raised after the reference is loaded (:meth:`_reference_loads`)."""
        try:
            return written.result()
        except RefusedAsWritten as refused:
            self._reference_loads(refused)
            raise

    def _candidate_session(
        self, model: onnx.ModelProto, low: int | None, mode: str, exposed: list[tuple[str, int]], written: PendingAsWritten | None
    ) -> Runnable:
        """A session of the candidate (built before the reference's: see
        :meth:`_reference_loads`; ``written``: its load as written, asked
        whether the model is sound where its emulation twin fails to load)."""
        sound = written.sound if written is not None else None  # (a refusal it raises is handled below)
        try:
            return runnable(model, low, self.provider, mode, exposed, self.base_dir, "candidate", sound=sound)
        except LoadFailure as failure:
            self._reference_loads(failure)
            raise

    def _reference_loads(self, failure: LoadFailure) -> None:
        """Where onnxruntime cannot load the candidate (``failure``), load the
        reference, as if its session came first: one onnxruntime refuses as
        written is the failure to report (the input's, in convert), not the
        candidate's; :class:`NeitherLoads` where the candidate is refused as
        written too (not only its emulation twin)."""
        if self._outputs_cache is not None or self._plain_session is not None:
            return  # (it ran)
        try:
            self._reference_session(self._extras)
        except TwinFailure:
            return  # (it loads as written: the candidate's failure stands)
        except LoadFailure as e:
            if isinstance(failure, TwinFailure):
                raise
            raise NeitherLoads(e.detail, failure.detail) from None

    def _reference_runs(self, tensors: list[str]) -> Iterator[tuple[dict, dict]]:
        """(feeds, reference values) per sample; outputs-only runs are cached when small."""
        if tensors:
            ref = self._reference_session([*((n, self.ref_ctx.types[n]) for n in tensors), *self._extras])
            for feeds in self.source:
                yield feeds, ref.run(feeds)
            return
        if self._outputs_cache is not None:
            yield from self._outputs_cache
            return
        if self._plain_session is None:
            self._plain_session = self._reference_session(self._extras)
        kept: list[tuple[dict, dict]] | None = []
        size = 0
        wanted = [*self.output_names, *(n for n, _ in self._extras)]
        for feeds in self.source:
            values = self._plain_session.run(feeds)
            values = {n: values[n] for n in wanted}  # (a shared calibration session outputs every tensor)
            if kept is not None:
                size += sum(map(value_bytes, (*values.values(), *feeds.values())))
                if size <= self.cache_bytes:
                    kept.append((feeds, values))
                else:
                    kept = None
            yield feeds, values
        self._outputs_cache = kept

    def _reference_session(self, tensors) -> Runnable:
        tensors = list(tensors)
        if self._shared is not None and self._shared[1].issuperset(n for n, _ in tensors):
            return self._shared[0]  # (it outputs more than asked: the extra values are not read)
        # Decided once (its twin kept): a real run that cannot load falls back to the emulation under auto.
        mode = "always" if self.reference_emulated else self.config.emulate
        ref = runnable(
            self.reference, self.ref_low, self.provider, mode, tensors, self.base_dir, "reference", self._reference_twin
        )
        if ref.emulated:
            self._reference_twin = ref.twin
            if not self.reference_emulated:
                self.reference_emulated, self.reference_note = True, ref.note
        return ref


def validate(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    source: InputSource,
    config: ValidationConfig,
    plan: Plan | None = None,
    progress: Callable[[int], None] | None = None,
    base_dir: str | os.PathLike | None = None,
    calibration: Calibration | None = None,
) -> ValidationResult:
    """Compare ``candidate`` with ``reference`` on every sample of ``source``
    (``calibration``: a calibration run of ``reference``, whose session and,
    on the same samples, outputs are reused)."""
    validator = Validator(reference, source, config, cache_bytes=0, base_dir=base_dir, calibration=calibration)
    return validator.check(candidate, plan, progress=progress)


def _typed(model: onnx.ModelProto):
    ctx = build_context(model.graph)
    infer_types(ctx, model_opsets(model))
    return ctx


def _low_key(elem: int | None) -> str:
    return "bf16" if elem == TensorProto.BFLOAT16 else "fp16"
