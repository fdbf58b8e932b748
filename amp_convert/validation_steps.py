"""The validation side of a run from files: the samples, the calibration
pass, the validated comparison and the auto search, and the vetting done
before anything is converted (options this run will not read, a target
opset onnxruntime cannot load)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .blame import run_failures
from .errors import UsageError
from .options import AutoOptions, ConvertOptions, ValidationOptions

if TYPE_CHECKING:
    import onnx

    from .auto import AutoResult, Trial
    from .calibrate import Calibration
    from .inputs import InputSource
    from .plan import Plan
    from .validation import ValidationResult
    from .workflow import Hooks


def input_source(reference: onnx.ModelProto, options: ValidationOptions, announce: Callable[[str], None] | None = None):
    """The validation inputs of ``options`` for ``reference``; where no input
    option was given, ``announce`` is told what is generated."""
    from .inputs import make_source

    o = options
    source = make_source(reference, o.inputs, o.input_shape, o.input_range, o.samples, o.seed)
    if announce is not None and not o.inputs_given:
        announce(source.summary())
    return source


def validate_models(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    source: InputSource,
    options: ValidationOptions,
    plan: Plan | None,
    folder: Path | None = None,
    calibration: Calibration | None = None,
    dtype: str | None = None,
    hooks: Hooks | None = None,
    target_provider: str = "cuda",
) -> ValidationResult:
    """Compare ``candidate`` with ``reference`` on ``source``'s samples as
    ``options`` says (``dtype``: the conversion's low dtype; None: the
    candidate's, as detected; ``target_provider``: the one the conversion
    aimed at)."""
    from .emulate import detect_low_dtype
    from .validation import validate

    dtype = dtype or ("bf16" if detect_low_dtype(candidate) == 16 else "fp16")
    config = validation_config(options, dtype, per_node=options.per_node, target_provider=target_provider)
    run = partial(validate, reference, candidate, source, config, plan, base_dir=folder, calibration=calibration)
    if hooks is None or hooks.validating is None:
        result = run()
    else:
        with hooks.validating(source.count() or 1) as progress:
            result = run(progress=progress)
    result.inputs = source.describe()
    return result


def validation_config(options: ValidationOptions, dtype: str, per_node: bool | None, target_provider: str):
    """The validator's :class:`~amp_convert.validation.ValidationConfig` for ``options``."""
    from .tolerance import output_tolerances, run_tolerance
    from .validation import ValidationConfig

    return ValidationConfig(
        options.provider,
        options.emulate,
        per_node,
        options.top,
        run_tolerance(options, dtype),
        options.pin_choices,
        dtype,
        target_provider=target_provider,
        tolerances=output_tolerances(options),
    )


def calibration_samples(reference, options: ValidationOptions) -> tuple[Any, Iterator[dict]]:
    """The calibration files' source and its samples, the first one read (and
    checked against the model) now: files that hold none are refused before
    any onnxruntime session is built or anything converted (else the
    calibrated rule would be off without a word)."""
    from .inputs import make_source

    o = options
    given = make_source(reference, o.calibration, o.input_shape, o.input_range, o.samples, o.seed, option="calibration")
    samples = iter(given)
    first = next(samples)  # (files holding no sample are refused here: see InputSource)
    return given, chain([first], samples)


def calibration_ranges(reference, samples, source, options: ValidationOptions, folder: Path):
    """fp32 value ranges for the calibrated safety rule (one streaming pass
    over ``samples``, from ``source``: the calibration files', else the validation inputs)."""
    if samples is None:
        return None
    from .calibrate import calibrate

    with run_failures(source):
        return calibrate(reference, samples, options.provider, base_dir=folder, emulate=options.emulate)


def check_unused_options(reference, options: ValidationOptions, validating: bool, calibrating: bool) -> None:
    """Sample options this run does not read (``calibrating``: whether it reads the calibration files)
    are vetted all the same: a missing file, an unknown input name are refused, as where they are read."""
    given = (("inputs", options.inputs, validating), ("calibration", options.calibration, calibrating))
    unread = [(option, files) for option, files, read in given if files and not read]
    names = not (validating or calibrating) and (options.input_shape or options.input_range)
    if not (unread or names):  # (nothing to vet: the inputs module stays unloaded)
        return
    from .inputs import check_unused

    for option, files in unread:
        check_unused(reference, files, option)
    if names:
        check_unused(reference, shapes=options.input_shape, ranges=options.input_range)


def auto_search(
    reference: onnx.ModelProto,
    options: ConvertOptions,
    auto: AutoOptions,
    source: InputSource,
    calibration: Calibration | None,
    checking: ValidationOptions,
    *,
    check: str = "full",
    on_trial: Callable[[Trial], None] | None = None,
    folder: Path | None = None,
) -> AutoResult:
    """The ``level="auto"`` search on ``source``'s samples, judged as ``checking`` says."""
    from .auto import auto_convert

    config = validation_config(checking, options.dtype, per_node=True, target_provider=options.target_provider)
    start = options.auto_start(auto.auto_from)
    with run_failures(source, check=check):
        return auto_convert(reference, options, source, config, calibration, auto.max_trials, start, check, on_trial, folder)


def check_target_runs(model, target: int, input_loads: Callable[[], None]) -> None:
    """Validation runs the model at the opset ``target_opset`` asks for: one
    onnxruntime cannot load is refused before anything is converted (else
    its refusal would read as a conversion's failure), unless the input
    does not load either (``input_loads`` raises): an IR version newer than
    onnxruntime reads is the input's, which no opset would change."""
    import onnxruntime

    from .ortversions import min_ir_for_opset, version_refusal

    ir_version = max(model.ir_version, min_ir_for_opset(target))
    refusal = version_refusal(target, ir_version)
    if refusal is not None:
        input_loads()
        raise UsageError(
            f"`target_opset` {target}: onnxruntime {onnxruntime.__version__} loads no model at opset {target} "
            f"(IR version {ir_version}): {refusal}; give a lower `target_opset`, or `validate` false to write it "
            "unvalidated",
            "target_opset",
        )


def input_loads(reference, options: ValidationOptions, folder: Path, source) -> None:
    """Load the input as validation runs it: where onnxruntime cannot, an
    InputError naming the input (through :func:`run_failures`)."""
    from .emulate import detect_low_dtype
    from .runner import choose_provider, runnable

    provider, _ = choose_provider(options.provider)
    with run_failures(source):
        runnable(reference, detect_low_dtype(reference), provider, options.emulate, (), folder, "reference")
