"""``--level auto``: the most low precision that still meets the tolerance,
found by measurement.

The search starts from O3 (everything low) with the safety rules on
(unless ``--no-safety`` turned them off), and validates. While the model
fails, it keeps in fp32 the low nodes that the per-node diff ranks worst (one, then two, four ...: the error a node adds
over its inputs, overflow first). Once it passes, it tries to give the kept
nodes back in halves, least harmful first, and keeps what still passes.
``--auto-from O1|O2`` starts from a list level instead and grows: it tries to
run the fp32 nodes low, heaviest compute first, in halves (an
``--only-white-list`` or ``--only-black-list`` grows from the level it
converts as, O1 or O2). Every trial
counts against ``--max-trials``; the best passing trial wins. Where none
passes, the failing trial closest to passing (the fewest outputs failing,
then the most compute low) is the result, and it fails: an fp32 model is
never handed back as a success. Inputs are seeded, so the search is
deterministic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import onnx

from .calibrate import Calibration
from .check import check_converted
from .graph import NodeLabels
from .inputs import InputSource
from .op_rules import fp32_by_lists
from .options import ConvertOptions
from .pipeline import ConversionResult, convert
from .plan import Plan, Precision
from .validation import ValidationConfig, ValidationResult, Validator


@dataclass
class Trial:
    number: int
    step: str
    kept_fp32: tuple[str, ...]
    forced_low: tuple[str, ...]
    passed: bool
    low_compute: float  # fraction of the float compute that runs low
    casts: int
    seconds: float
    worst: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "number": self.number,
            "step": self.step,
            "kept_fp32": list(self.kept_fp32),
            "forced_low": list(self.forced_low),
            "passed": self.passed,
            "low_compute": round(self.low_compute, 6),
            "casts": self.casts,
            "seconds": round(self.seconds, 4),
            "worst": list(self.worst),
        }


def trials_phrase(n: int) -> str:
    """``n`` trials, said as a count ("1 trial", "3 trials")."""
    return f"{n} trial{'' if n == 1 else 's'}"


@dataclass
class AutoResult:
    conversion: ConversionResult
    validation: ValidationResult  # the chosen trial's; it fails where no trial passed (the closest is chosen)
    trials: list[Trial] = field(default_factory=list)
    start: str = "O3"
    seconds: float = 0.0
    chosen: int = 0  # trial number of the result

    @property
    def low_compute(self) -> float:
        return next((t.low_compute for t in self.trials if t.number == self.chosen), 0.0)

    @property
    def tried(self) -> str:
        """How many trials ran, said as a count."""
        return trials_phrase(len(self.trials))

    def failures(self, most: int = 3) -> str:
        """The outputs the chosen trial fails and why ("y: max abs error 0.03 > 0.011 (...)"),
        the first ``most`` of them ("" where it passes)."""
        v = self.validation
        failing = [(o.name, o.verdict(v.tolerance_for(o.name))) for o in v.outputs]
        said = [f"{name}: {'; '.join(reasons)}" for name, reasons in failing if reasons]
        more = f"; and {len(said) - most} more output(s)" if len(said) > most else ""
        return "; ".join(said[:most]) + more

    def as_dict(self) -> dict:
        kept = {e.name: e.reason for e in self.conversion.plan if e.precision is Precision.FP32 and e.rule != "control-flow"}
        return {
            "start": self.start,
            "trials": [t.as_dict() for t in self.trials],
            "chosen_trial": self.chosen,
            "low_compute": round(self.low_compute, 6),
            "seconds": round(self.seconds, 4),
            "kept_fp32": kept,
        }


def compute_weights(model: onnx.ModelProto, calibration: Calibration | None) -> dict[str, float]:
    """Rough cost of each main-graph node: multiply-accumulates for the
    GEMM-like ops, output elements for the rest (1 where shapes are unknown)."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    if calibration is not None:
        shapes.update({n: r.shape for n, r in calibration.ranges.items() if r.size})

    def size(name: str) -> int:
        shape = shapes.get(name)
        if shape is None:
            return 0
        n = 1
        for d in shape:
            n *= max(int(d), 1)
        return n

    weights = {}
    nodes = model.graph.node
    labels = NodeLabels([node.name for node in nodes], [node.op_type for node in nodes])
    for i, node in enumerate(nodes):
        out = size(node.output[0]) if node.output else 0
        w = float(out or 1)
        op = node.op_type
        if op in ("Conv", "ConvTranspose") and len(node.input) > 1 and shapes.get(node.input[1]):
            kernel = shapes[node.input[1]]
            per_output = kernel[1] if op == "Conv" else kernel[0]
            for d in kernel[2:]:
                per_output *= d
            w = float(out) * per_output if out else w
        elif op in ("MatMul", "Gemm") and shapes.get(node.input[0]):
            a = shapes[node.input[0]]
            transposed = op == "Gemm" and any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if transposed else a[-1]
            w = float(out) * max(int(k), 1) if out else w
        elif op in ("LSTM", "GRU", "RNN") and shapes.get(node.input[1]) and shapes.get(node.input[2]):
            gates_in, gates_hidden = shapes[node.input[1]], shapes[node.input[2]]
            w = float(out) * (gates_in[1] * gates_in[2] + gates_hidden[1] * gates_hidden[2]) / max(gates_in[2], 1)
        weights[labels[i]] = w
    return weights


def low_compute_fraction(plan: Plan, weights: dict[str, float]) -> float:
    low = total = 0.0
    for e in plan:
        if e.precision is Precision.UNCHANGED or e.rule == "control-flow":
            continue
        w = weights.get(e.name, 1.0) if e.graph == "" else 1.0
        total += w
        if e.precision is Precision.LOW:
            low += w
    return low / total if total else 0.0


class AutoSearch:
    """One search: its trials, its budget, its best passing result."""

    def __init__(
        self,
        reference: onnx.ModelProto,
        options: ConvertOptions,
        source: InputSource,
        config: ValidationConfig,
        calibration: Calibration | None,
        max_trials: int,
        check: str,
        on_trial: Callable[[Trial], None] | None,
        external_dir: str | os.PathLike | None = None,
    ):
        self.reference = reference
        self.options = options
        # (each trial's model is not loaded as written: the chosen one is, once, at the end)
        self.validator = Validator(
            reference, source, replace(config, per_node=False, load_check=False), base_dir=external_dir, calibration=calibration
        )
        self.external_dir = external_dir
        self.calibration = calibration
        self.max_trials = max_trials
        self.check = check
        self.on_trial = on_trial
        self.weights = compute_weights(reference, calibration)
        self.trials: list[Trial] = []
        # Each trial's (result, validation) by the precisions its plan gives: a step whose conversion
        # is one already judged (a node given back that follows fp32 inputs) costs no trial.
        self.judged: dict[tuple, tuple[ConversionResult, ValidationResult]] = {}
        self.best: tuple[float, ConversionResult, ValidationResult, int] | None = None
        # The failing trial closest to passing: (failing outputs, -low compute), result, validation, number.
        self.closest: tuple[tuple[int, float], ConversionResult, ValidationResult, int] | None = None

    @property
    def safety(self) -> bool:
        """The safety rules are on in every trial unless the user turned them off (--no-safety)."""
        return self.options.safety is not False

    @property
    def rules(self) -> str:
        return "with safety rules" if self.safety else "without safety rules"

    @property
    def budget_left(self) -> bool:
        return len(self.trials) < self.max_trials

    def trial(self, step: str, level: str, keep: tuple[str, ...] = (), force: tuple[str, ...] = ()):
        t0 = time.perf_counter()
        opts = replace(self.options, level=level, safety=self.safety, keep_fp32_nodes=keep, force_low_nodes=force).validated()
        # Trials use the basic checker; the chosen model gets the full one at the end.
        result = convert(
            self.reference,
            opts,
            check="basic" if self.check == "full" else self.check,
            calibration=self.calibration,
            external_dir=self.external_dir,
        )
        # (the same plan: every node's precision and low slots, and the same folds)
        nodes = tuple((e.graph, e.name, e.precision, e.low_inputs, e.low_outputs) for e in result.plan)
        precisions = (nodes, tuple(result.plan.folded))
        if precisions in self.judged:
            return self.judged[precisions]
        validation = self.validator.check(result.model, result.plan)
        if not validation.passed:  # the search needs to know where the error enters
            validation = self.validator.check(result.model, result.plan, per_node=True)
        fraction = low_compute_fraction(result.plan, self.weights)
        trial = Trial(
            len(self.trials) + 1,
            step,
            keep,
            force,
            validation.passed,
            fraction,
            result.casts_after,
            time.perf_counter() - t0,
            tuple(n.name for n in validation.offenders()[:5]),
        )
        self.trials.append(trial)
        if self.on_trial:
            self.on_trial(trial)
        if validation.passed and (self.best is None or fraction > self.best[0]):
            self.best = (fraction, result, validation, trial.number)
        if not validation.passed:
            failing = sum(bool(o.verdict(validation.tolerance_for(o.name))) for o in validation.outputs)
            if self.closest is None or (failing, -fraction) < self.closest[0]:
                self.closest = ((failing, -fraction), result, validation, trial.number)
        self.judged[precisions] = (result, validation)
        return result, validation

    def keep_worst(self, level: str, result, validation, kept: list[str]):
        """Keep the worst low nodes fp32, doubling the batch, until it passes."""
        batch = 1
        while not validation.passed and self.budget_left:
            worst = _worst_low_nodes(result.plan, validation, set(kept))
            if not worst:
                break
            kept += worst[:batch]
            result, validation = self.trial(
                f"keep {len(worst[:batch])} more fp32 (most error reaching the outputs)", level, tuple(kept)
            )
            batch *= 2
        return result, validation

    def give_back(self, level: str, kept: list[str]) -> None:
        """Try the kept nodes low again in halves, least harmful first."""
        candidates = list(reversed(kept))  # kept worst-first
        chunk = max(len(candidates) // 2, 1)
        while candidates and self.budget_left:
            giving = candidates[:chunk]
            keep = tuple(n for n in kept if n not in giving)
            _, validation = self.trial(f"give back {len(giving)} node(s)", level, keep)
            if validation.passed:
                kept[:] = list(keep)
                candidates = candidates[chunk:]
            elif chunk > 1:
                chunk //= 2
            else:
                candidates = candidates[1:]

    def from_o3(self) -> None:
        kept: list[str] = []
        result, validation = self.trial(f"O3 {self.rules}", "O3")
        result, validation = self.keep_worst("O3", result, validation, kept)
        if validation.passed:
            self.give_back("O3", kept)
            return
        for level in ("O2", "O1"):
            if not self.budget_left:
                return
            result, validation = self.trial(f"fall back to {level}", level, tuple(kept))
            if validation.passed:  # (the nodes kept at O3 may pass low at this level: blamed for O3's error)
                self.give_back(level, self.low_at(level, result.plan, kept))
                return

    def low_at(self, level: str, plan: Plan, kept: list[str]) -> list[str]:
        """The nodes of ``kept`` that ``level`` would run low: the others (its
        black list's) stay fp32 there whatever the search does, and giving
        them back would spend a trial on the model it already has."""
        lists = replace(self.options, level=level).op_lists()
        wanted = set(kept)
        ops = {e.name: (e.op_type, e.domain) for e in plan.entries.get("", []) if e.name in wanted}
        return [n for n in kept if not fp32_by_lists(*ops[n], lists, level)]

    def from_level(self, level: str) -> None:
        result, validation = self.trial(f"{level} {self.rules}", level)
        if not validation.passed:
            self.keep_worst(level, result, validation, [])
            return
        candidates = sorted(
            (e.name for e in result.plan.entries.get("", []) if e.precision is Precision.FP32 and e.rule in _GROWABLE),
            key=lambda n: -self.weights.get(n, 1.0),
        )
        forced: list[str] = []
        chunk = max(len(candidates), 1)
        while candidates and self.budget_left:
            trying = candidates[:chunk]
            _, validation = self.trial(f"run {len(trying)} more node(s) low", level, (), tuple(forced + trying))
            if validation.passed:
                forced += trying
                candidates = candidates[chunk:]
            elif chunk > 1:
                chunk //= 2
            else:
                candidates = candidates[1:]


# fp32 decisions the search may overturn: list, level and safety choices,
# never the schema's or the user's. Not a source's ("source": its readers
# need fp32): it follows them as they grow, and forced low alone it runs
# nothing low, only adds a Cast back to fp32 (a Resize's scales).
_GROWABLE = frozenset({"black-list", "level", "follow", "safety-initializer-range", "safety-data-range"})


def _worst_low_nodes(plan: Plan, validation: ValidationResult, exclude: set[str]) -> list[str]:
    """Low nodes of the main graph ranked by the error they add, worst first."""
    low = {e.name for e in plan.entries.get("", []) if e.precision is Precision.LOW and not e.rule.startswith("user")}
    return [n.name for n in validation.ranked() if n.name in low and n.name not in exclude]


def auto_convert(
    reference: onnx.ModelProto,
    options: ConvertOptions,
    source: InputSource,
    config: ValidationConfig,
    calibration: Calibration | None,
    max_trials: int = 12,
    start: str | None = None,
    check: str = "full",
    on_trial: Callable[[Trial], None] | None = None,
    external_dir: str | os.PathLike | None = None,
) -> AutoResult:
    """Search for the assignment with the most low-precision compute that
    passes validation, in at most ``max_trials`` conversions + validations;
    where none passes, the result is the closest failing one (its
    validation fails).
    ``start``: O1 or O2 to grow from that level (default: see :meth:`ConvertOptions.auto_start`).
    The chosen model is loaded as written (see :meth:`Validator.as_written`):
    onnxruntime's refusal of it is a :class:`~amp_convert.errors.RefusedAsWritten`."""
    began = time.perf_counter()
    start = options.auto_start(start)
    search = AutoSearch(reference, options, source, config, calibration, max_trials, check, on_trial, external_dir)
    if start == "O3":
        search.from_o3()
    else:
        search.from_level(start)
    passed = search.best is not None
    _, result, validation, number = search.best if passed else search.closest
    if config.per_node is not False and not validation.nodes:
        # The trials that passed ran without the per-node diff: the chosen model's report gets it, as any
        # conversion's (its verdict stays the one the search judged by).
        search.validator.config = replace(search.validator.config, per_node=config.per_node)  # (None: by size, as usual)
        diffed = search.validator.check(result.model, result.plan)
        validation.nodes, validation.per_node_note = diffed.nodes, diffed.per_node_note
    # Trials ran the basic check; the chosen one gets the full one, where the
    # pipeline checked it: in memory, or (external data, over 2 GB) as the written file.
    if not result.check_deferred:
        result.check_deferred = not check_converted(result.model, check)
    if config.load_check:  # (onnxruntime's refusal of it as written is a RefusedAsWritten)
        written = search.validator.as_written(result.model)
        validation.kernel_note = written.note if written is not None else ""
    result.plan.level = "auto"
    if passed:
        result.plan.notes.append(f"auto: trial {number} of {len(search.trials)} chosen (start {start})")
    else:
        result.plan.notes.append(
            f"auto: no assignment met the tolerance in {trials_phrase(len(search.trials))}; trial {number}, the closest "
            f"(the fewest outputs failing, then the most compute low), is the result, and fails (start {start})"
        )
    return AutoResult(result, validation, search.trials, start, time.perf_counter() - began, chosen=number)
