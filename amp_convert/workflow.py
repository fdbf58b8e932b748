"""A whole run from files: load -> plan -> rewrite -> clean up -> check ->
validate -> report -> save, as ``amp-convert MODEL`` and ``amp-convert
compare`` do it. The command only parses options into these calls and
prints what they return."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .blame import run_failures
from .errors import ConversionError, UsageError
from .load import remember_inputs
from .options import AutoOptions, ConvertOptions, OutputOptions, ValidationOptions
from .output_paths import check_outputs, files_size
from .report import Report
from .validation_steps import (
    auto_search,
    calibration_ranges,
    calibration_samples,
    check_target_runs,
    check_unused_options,
    input_loads,
    input_source,
    validate_models,
)

if TYPE_CHECKING:
    from .auto import AutoResult, Trial
    from .pipeline import ConversionResult
    from .validation import ValidationResult


@dataclass
class Hooks:
    """What a run tells its caller as it goes (each None: nothing).

    ``inputs``: the line saying what inputs were generated, where no input
    option was given. ``stage``: a conversion stage done. ``trial``: an auto
    trial judged. ``validating``: called with the number of samples (None
    when unknown), returns a context whose value is called with each
    sample's count as it is compared.
    """

    inputs: Callable[[str], None] | None = None
    stage: Callable[[str], None] | None = None
    trial: Callable[[Trial], None] | None = None
    validating: Callable[[int | None], AbstractContextManager[Callable[[int], None]]] | None = None


@dataclass
class Run:
    """What :func:`convert_file` or :func:`compare_files` did.

    ``conversion``: None for a comparison. ``validation``: None when not
    validated. ``auto``: the search, for ``level="auto"``. ``written``:
    whether the model was written to ``output``. ``passed``: whether it met
    the tolerance (True when not validated). ``report``: the whole account.
    """

    report: Report
    output: Path
    written: bool
    conversion: ConversionResult | None = None
    validation: ValidationResult | None = None
    auto: AutoResult | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed


def default_output(model: Path, dtype: str) -> Path:
    """``model`` with a .fp16/.bf16 suffix before .onnx (the output when none is given)."""
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    return model.with_name(f"{stem}.{dtype}.onnx")


def convert_file(
    model: str | Path,
    options: ConvertOptions | None = None,
    *,
    validation: ValidationOptions | None = None,
    validate: bool = True,
    auto: AutoOptions | None = None,
    outputs: OutputOptions | None = None,
    check: str = "full",
    hooks: Hooks | None = None,
) -> Run:
    """Convert the model file ``model`` and write what ``outputs`` asks for.

    Arguments: ``options`` (None: O2 fp16); ``validation``: the inputs and
    the verdict (None: the defaults), the calibration samples too; ``validate``:
    whether the result is validated; ``auto`` (given: the ``level="auto"``
    search, which needs ``validate``); ``check``: the ONNX checker's mode (full, basic,
    none); ``hooks``: progress callbacks.
    Returns a :class:`Run`; a model out of tolerance is written only with
    ``outputs.write_on_fail``. Every output is checked before anything is
    converted, and written atomically (all or none); the input is never
    changed.
    Raises UsageError for contradictory options, InputError (both are
    AmpError) for a bad input, ConversionError where the conversion failed.
    """
    model = Path(model)
    options = (options or ConvertOptions()).validated()
    outputs = (outputs or OutputOptions()).validated()
    validation = (validation or ValidationOptions()).validated()
    hooks = hooks or Hooks()
    if auto is not None:
        auto = auto.validated()
        if not validate:
            raise UsageError("`level` auto measures accuracy: it cannot run with `validate` false", "level")
    return _Conversion(model, options, validation, validate, auto, outputs, check, hooks).run()


class _Conversion:
    """One :func:`convert_file` run: its steps, sharing what they know."""

    def __init__(self, model, options, validation, validate, auto, outputs, check, hooks) -> None:
        self.model: Path = model
        self.options: ConvertOptions = options
        self.checking: ValidationOptions = validation
        self.validating: bool = validate
        self.auto: AutoOptions | None = auto
        self.outputs: OutputOptions = outputs
        self.check, self.hooks = check, hooks
        self.output = outputs.output or default_output(model, options.dtype)
        self.folder = model.parent

    def run(self) -> Run:
        from .load import read_model

        options, checking, validating = self.options, self.checking, self.validating
        if self.auto is not None:
            options.auto_start(self.auto.auto_from)  # (a contradiction is refused before the model is read)
        calibration_files = checking.calibration
        loaded = read_model(self.model, lazy_external=True)
        remember_inputs([*checking.inputs, *calibration_files])
        with loaded.checked():
            reference = loaded.model
            # Every output is checked before anything is converted or written.
            o = self.outputs
            data = self.output.with_name(f"{self.output.name}.data")
            targets = {"`output`": self.output, "`output`'s data file": data}
            reports = {"`plan_json`": o.plan_json, "`report`": o.report, "`html`": o.html}
            check_outputs([self.model], {**targets, **reports}, unchecked=("`output`'s data file",))
            self.input_external = bool(loaded.external_files)
            self.node_count = len(reference.graph.node)
            self.size_before = files_size(self.model, loaded.external_files)
            calibrating = self.auto is not None or options.safety_on  # (the calibrated rule is on: its samples are read)
            check_unused_options(reference, checking, validating, calibrating=calibrating and bool(calibration_files))
            source = input_source(reference, checking, self.hooks.inputs) if validating else None
            self.source = source
            calibration_source, samples = (
                calibration_samples(reference, checking) if calibrating and calibration_files else (source, source)
            )
            if source is not None and options.target_opset is not None:
                check_target_runs(reference, options.target_opset, partial(input_loads, reference, checking, self.folder, source))
            calibration = (
                calibration_ranges(reference, samples, calibration_source, checking, self.folder) if calibrating else None
            )
            self.searched = None
            if self.auto is not None:
                self.searched = auto_search(
                    reference,
                    options,
                    self.auto,
                    source,
                    calibration,
                    checking,
                    check=self.check,
                    on_trial=self.hooks.trial,
                    folder=self.folder,
                )
                result, validated = self.searched.conversion, self.searched.validation
            else:
                from .pipeline import convert

                # Without validation the fp32 model is not needed afterwards: convert it in place.
                result = convert(
                    reference,
                    options,
                    check=self.check,
                    calibration=calibration,
                    in_place=source is None,
                    external_dir=self.folder,
                    on_stage=self.hooks.stage,
                )
                with run_failures(source, check=self.check):
                    validated = (
                        validate_models(
                            reference,
                            result.model,
                            source,
                            checking,
                            result.plan,
                            self.folder,
                            calibration,
                            options.dtype,
                            self.hooks,
                            options.target_provider,
                        )
                        if source is not None
                        else None
                    )
                if calibration is not None:
                    calibration.session = None  # (its memory goes before the model is written)
        if calibration_files and not calibrating:
            rules = "`safety` false" if options.safety is False else f"at {options.effective_level}; `safety` turns them on"
            result.plan.notes.append(f"`calibration` not read: the safety rules, which use it, are off ({rules})")
        return self._write(result, validated)

    def _write(self, result: ConversionResult, validated: ValidationResult | None) -> Run:
        from .check import check_file
        from .external import payload
        from .load import check_input_model
        from .report import build_report, conversion_fields
        from .saving import TextFiles, save_model, writes_external

        o, output = self.outputs, self.output
        passed = validated is None or validated.passed
        write = passed or o.write_on_fail
        # The conversion makes no tensor external: a model read without any is
        # serialized once, here, and those bytes are written if it is one file.
        one_file = write and not self.input_external and o.external_data != "always"
        measured = payload(result.model, may_be_external=not one_file)
        size_after = measured.total
        searched = self.searched
        report_of = partial(
            build_report,
            command="convert",
            model_path=self.model,
            model_nodes=self.node_count,
            output_path=output,
            written=write,
            conversion=result,
            validation=validated,
            inputs=None if self.source is None else self.source.describe(),
            size_before=self.size_before,
            **conversion_fields(self.options, result, validated, searched),
        )
        made: list[dict] = []
        with TextFiles() as side_files:

            def write_reports(size: int) -> None:
                """The report, made once the written size is known, and every file asked for beside the model, written
                (in place only once the model is: a failure writing any of them writes nothing)."""
                made.append(report_of(size_after=size))
                if o.plan_json:
                    side_files.write(o.plan_json, result.plan.to_json())
                write_reports_to(side_files, Report(made[0]), o)

            if write:
                external = writes_external(o.external_data, self.input_external, size_after)
                deferred = result.check_deferred
                # Written as the bytes measured, the file's size is known; else it is read off the written files.
                exact = not external and measured.serialized is not None
                written: list[int] = [size_after] if exact else []

                def verify(path: Path) -> None:
                    if deferred:  # too large to check in memory: check the written file before it replaces anything
                        try:
                            check_file(path, self.check)
                        except ConversionError:
                            if self.check == "full":  # (blame the input when it fails the full check already: exit 2)
                                check_input_model(str(self.model), str(self.model), full_check=True)
                            raise
                    if not exact:
                        data = path.with_name(f"{output.name}.data")
                        written.append(path.stat().st_size + (data.stat().st_size if external and data.is_file() else 0))

                save_model(
                    result.model,
                    output,
                    external=external,
                    source_dir=self.folder,
                    before_commit=verify,
                    measured=measured,
                    meanwhile=lambda: write_reports(written[0]),  # (while the model is flushed to disk)
                )
            else:
                write_reports(size_after)
            side_files.place()
        return Run(Report(made[0]), output, write, result, validated, searched)


def compare_files(
    reference: str | Path,
    candidate: str | Path,
    validation: ValidationOptions | None = None,
    *,
    outputs: OutputOptions | None = None,
    hooks: Hooks | None = None,
) -> Run:
    """Compare the model file ``candidate`` (made by any tool) with ``reference``.

    ``validation``: how (None: the defaults, the candidate's low dtype
    detected); ``outputs``: its report and html files are written
    (atomically), nothing else. Returns a :class:`Run` without a
    conversion. Raises InputError where a file is bad or neither model
    loads, UsageError for bad options.
    """
    from .load import read_model
    from .report import build_report
    from .saving import TextFiles

    reference, candidate = Path(reference), Path(candidate)
    validation = (validation or ValidationOptions()).validated()
    outputs = (outputs or OutputOptions()).validated()
    hooks = hooks or Hooks()
    ref_loaded, cand_loaded = read_model(reference), read_model(candidate)  # (external data read into memory: the two
    ref_model, cand_model = ref_loaded.model, cand_loaded.model  # may live in different folders)
    remember_inputs(validation.inputs)
    check_outputs([reference, candidate], {"`report`": outputs.report, "`html`": outputs.html})
    source = input_source(ref_model, validation, hooks.inputs)
    with run_failures(source, (str(reference), str(candidate))):
        validated = validate_models(ref_model, cand_model, source, validation, None, hooks=hooks)
    report = Report(
        build_report(
            command="compare",
            model_path=reference,
            model_nodes=len(ref_model.graph.node),
            output_path=candidate,
            written=False,
            options=None,
            validation=validated,
            inputs=source.describe(),
            timings={"validate": validated.seconds},
            size_before=files_size(reference, ref_loaded.external_files),
            size_after=files_size(candidate, cand_loaded.external_files),
            exit_code=0 if validated.passed else 1,
        )
    )
    with TextFiles() as files:
        write_reports_to(files, report, outputs)
        files.place()
    return Run(report, candidate, False, validation=validated)


def write_reports_to(files, report: Report, outputs: OutputOptions) -> None:
    """The JSON and HTML reports ``outputs`` asks for, staged in ``files`` (a :class:`~amp_convert.saving.TextFiles`)."""
    if outputs.report:
        files.write(outputs.report, report.to_json())
    if outputs.html:
        files.write(outputs.html, report.to_html())
