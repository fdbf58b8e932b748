"""The Python API: everything ``amp-convert`` does, on models in memory or
on files.

========================  =====================================================
``convert``               a model in memory, every level (auto included)
``validate``              a candidate against its fp32 reference, on samples
``compare``               two model files, as ``amp-convert compare``: a Report
``convert_file``          a model file, as ``amp-convert MODEL``: converted,
                          validated, reported and saved
``save``                  a model written atomically, external data as needed
``load_config``           a config file (``--config``) as convert_file's options
``Report``                a run's account, as JSON, HTML or text
========================  =====================================================

Every error is an :class:`~amp_convert.errors.AmpError` (a bad call:
:class:`~amp_convert.errors.UsageError`; a bad model or file:
:class:`~amp_convert.errors.InputError`) or a
:class:`~amp_convert.errors.ConversionError` (amp-convert failed); messages
name the option's field in backquotes (`` `atol` ``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from .config import ConfigFile, load_config
from .errors import UsageError
from .options import EXTERNAL_DATA, AutoOptions, ConvertOptions, OutputOptions, ValidationOptions, with_fields
from .pipeline import ConversionResult, convert_options, load_input
from .pipeline import convert as _convert
from .report import Report
from .workflow import Run, compare_files, convert_file

if TYPE_CHECKING:
    from .auto import Trial
    from .calibrate import Calibration
    from .plan import Plan
    from .validation import ValidationResult

ModelLike = onnx.ModelProto | str | os.PathLike

__all__ = ["ConfigFile", "Report", "Run", "compare", "convert", "convert_file", "load_config", "save", "validate"]


def convert(
    model: ModelLike,
    options: ConvertOptions | None = None,
    *,
    validation: ValidationOptions | None = None,
    max_trials: int = 8,
    auto_from: str | None = None,
    check: str = "full",
    calibration: Calibration | None = None,
    in_place: bool = False,
    external_dir: str | os.PathLike | None = None,
    on_stage: Callable[[str], None] | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    **option_values: Any,
) -> ConversionResult:
    """Convert an fp32 model to mixed precision.

    Arguments:
        model: an ``onnx.ModelProto`` (never changed unless ``in_place``) or
            a path to an .onnx file.
        options: how to convert; or give :class:`ConvertOptions` fields as
            keywords (``level="O2", dtype="bf16", black_list=["Softmax"]``).
        validation: for ``level="auto"``, the samples and the verdict the
            search measures by (None: generated samples, default
            tolerances); unused at O0-O3.
        max_trials, auto_from: the auto search's budget and starting level
            (O1 or O2; None: O3, or the level an only-list implies).
        check: the ONNX checker on the result: full, basic or none.
        calibration: fp32 ranges (:func:`amp_convert.calibrate.calibrate`)
            for the calibrated safety rule; the auto search makes its own.
        in_place: convert a ModelProto from
            :func:`amp_convert.load.load_model` without copying it.
        external_dir: the folder of a model whose external data was left on
            disk (``load_model(path, lazy_external=True)``).
        on_stage, on_trial: called with each stage's name as it ends, and
            with each auto trial as it is judged.

    Returns:
        A :class:`ConversionResult` (``model, plan = convert(...)`` works).
        For ``level="auto"`` its ``auto`` holds the search and its
        ``validation`` the chosen trial's verdict; where no assignment met
        the tolerance that verdict fails (``result.validation.passed`` is
        False) and the model is the closest trial's, never the fp32 one.

    Raises:
        UsageError: bad or contradictory options. InputError: a model that
        is not a valid fp32 ONNX model. ConversionError: the conversion
        (or, for auto, a validation run) failed.
    """
    level = option_values.get("level", options.level if options is not None else None)
    if level != "auto":
        if validation is not None:
            raise UsageError("`validation` applies to `level` auto only; validate a result with validate()", "validation")
        return _convert(
            model,
            options,
            check=check,
            calibration=calibration,
            in_place=in_place,
            external_dir=external_dir,
            on_stage=on_stage,
            **option_values,
        )
    options = replace(convert_options(options, option_values), level=None).validated()
    auto = AutoOptions(max_trials, auto_from).validated()
    options.auto_start(auto.auto_from)
    return _auto(model, options, (validation or ValidationOptions()).validated(), auto, check, on_trial, external_dir)


def _auto(model, options, checking, auto, check, on_trial, external_dir) -> ConversionResult:
    from .validation_steps import auto_search, calibration_ranges, calibration_samples, input_source

    reference = load_input(model)
    source = input_source(reference, checking)
    samples_source, samples = calibration_samples(reference, checking) if checking.calibration else (source, source)
    calibration = calibration_ranges(reference, samples, samples_source, checking, external_dir)
    searched = auto_search(
        reference, options, auto, source, calibration, checking, check=check, on_trial=on_trial, folder=external_dir
    )
    result = searched.conversion
    result.validation, result.auto = searched.validation, searched
    result.validation.inputs = source.describe()
    return result


def validate(
    reference: ModelLike,
    candidate: ModelLike,
    options: ValidationOptions | None = None,
    *,
    plan: Plan | None = None,
    dtype: str | None = None,
    target_provider: str = "cuda",
    **fields_given: Any,
) -> ValidationResult:
    """Run ``candidate`` and its fp32 ``reference`` with onnxruntime on the
    same samples and judge every output.

    Arguments:
        reference, candidate: ``onnx.ModelProto`` or paths; neither is changed.
        options: samples, tolerances, provider and emulation; or give
            :class:`ValidationOptions` fields as keywords (``atol=1e-2``,
            ``inputs=["batch.npz"]``, ``tolerance=["probs:min_top1=0.99"]``).
        plan: the conversion's plan, for the per-node diff's attribution
            (None: no per-node pinning).
        dtype: the low dtype, fp16 or bf16 (None: detected in ``candidate``).
        target_provider: the provider the conversion aimed at (cuda, cpu, none).

    Returns:
        A :class:`~amp_convert.validation.ValidationResult`: per-output
        statistics, offenders, ``passed``, and ``inputs`` (what the samples were).

    Raises:
        UsageError: bad options. InputError: a model or sample file that is
        bad, or that onnxruntime refuses. ConversionError: a failure that is
        amp-convert's (such as an emulation twin onnxruntime cannot load).
    """
    from .blame import run_failures
    from .validation_steps import input_source, validate_models

    checking = with_fields(options or ValidationOptions(), fields_given).validated()
    ref, cand = load_input(reference), load_input(candidate)
    source = input_source(ref, checking)
    names = tuple(str(m) if not isinstance(m, onnx.ModelProto) else "" for m in (reference, candidate))
    with run_failures(source, names if all(names) else None):
        return validate_models(ref, cand, source, checking, plan, dtype=dtype, target_provider=target_provider)


def compare(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    options: ValidationOptions | None = None,
    *,
    report: str | os.PathLike | None = None,
    html: str | os.PathLike | None = None,
    **fields_given: Any,
) -> Report:
    """Compare the model file ``candidate`` (made by any tool) with the fp32
    ``reference`` file, as ``amp-convert compare`` does.

    ``options`` or :class:`ValidationOptions` fields as keywords say how;
    ``report`` and ``html``: files the JSON and HTML reports are written to
    (atomically). Returns the :class:`Report`; ``report.passed`` is the
    verdict. Raises UsageError for bad options, InputError where a file is
    bad or onnxruntime refuses it.
    """
    checking = with_fields(options or ValidationOptions(), fields_given)
    return compare_files(reference, candidate, checking, outputs=OutputOptions(report=report, html=html)).report


def save(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data: str = "auto",
    source_dir: str | os.PathLike | None = None,
) -> Path:
    """Write ``model`` to ``path`` atomically: all of it, or nothing.

    ``external_data``: always (tensors to ``<name>.data`` beside it), never
    (one file, at most 2 GiB), or auto (external where the model is over
    2 GiB or still reads tensors from data files). ``source_dir``: the
    folder a model's external data files are read from (its input's
    folder). Written with external data, ``model``'s large tensors are
    left referring to the new data file. Returns ``path``. Raises
    UsageError for a bad ``external_data``, AmpError for a path that cannot
    be written as a file or a model too large for one file.
    """
    from .external import payload
    from .saving import check_output_path, save_model, writes_external

    if external_data not in EXTERNAL_DATA:
        raise UsageError(f"unknown `external_data` {external_data!r}: use one of {', '.join(EXTERNAL_DATA)}", "external_data")
    target = Path(path)
    check_output_path(target)
    measured = payload(model)
    external = writes_external(external_data, measured.has_external, measured.total)
    save_model(model, target, external=external, source_dir=source_dir, measured=None if external else measured)
    return target
