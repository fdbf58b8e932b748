"""Command line: ``amp-convert MODEL --level O2 -o OUT`` and friends.

Options come in groups shared by the commands (as Polygraphy's tools share
argument groups). Every user error is one line on stderr and exit code 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import __version__
from .emulate import EMULATE_MODES
from .errors import AmpError, ConversionError, LoadFailure, ModelFailure, NeitherLoads, RefusedAsWritten, TwinFailure
from .external import PROTOBUF_LIMIT
from .lists import LEVELS, ORT_QUANTIZED_OPS, PROFILES
from .load import remember_inputs
from .options import IO_TYPES, PROVIDERS, ConvertOptions

if TYPE_CHECKING:
    from .save import TextFiles

EXIT_OK, EXIT_TOLERANCE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # (click 8.2 on; 8.1 prints the help itself)

# Config-file keys: the long option names, with '-' or '_'.
PARAMETER_NAMES = {
    "json": "json_out",
    "lists": "lists_profile",
    "tolerance": "tolerances",
}  # where the parameter is named otherwise
MULTIPLE_KEYS = {"white_list", "black_list", "only_white_list", "only_black_list", "keep_fp32", "force_low"}
MULTIPLE_KEYS |= {"inputs", "input_shape", "input_range", "calibration", "tolerance"}
CONFIG_KEYS = {
    "level",
    "dtype",
    "lists",
    "white_list",
    "black_list",
    "only_white_list",
    "only_black_list",
    "keep_fp32",
    "force_low",
    "keep_batchnorm_fp32",
    "fold_batchnorm",
    "io_types",
    "safety",
    "initializer_range",
    "clip_initializers",
    "data_max",
    "calibration",
    "max_trials",
    "auto_from",
    "check",
    "external_data",
    "target_opset",
    "target_provider",
    "output",
    "explain",
    "plan_json",
    "quiet",
    "validate",
    "write_on_fail",
    "provider",
    "emulate",
    "inputs",
    "input_shape",
    "input_range",
    "samples",
    "seed",
    "atol",
    "rtol",
    "min_cosine",
    "min_top1",
    "check_error_stat",
    "error_quantile",
    "tolerance",
    "per_node",
    "pin_choices",
    "top",
    "report",
    "html",
    "json",
}


class DefaultCommandGroup(click.Group):
    """A group whose first argument is a model path unless it names a
    subcommand: ``amp-convert model.onnx ...`` means ``amp-convert convert model.onnx ...``."""

    default_command = "convert"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def _split_ops(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--white-list Add,Mul --white-list Sub`` -> ('Add', 'Mul', 'Sub')."""
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return tuple(out)


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager --config: the file's values become the defaults, so flags given
    on the command line override them."""
    if not value:
        return value
    path = Path(value)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        if path.is_dir():
            raise click.BadParameter(f"{value}: is a directory, not a TOML file", param_hint="--config")
        if not path.is_file():
            raise click.BadParameter(f"{value}: no such file", param_hint="--config")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        remember_inputs([path])  # (no output may replace it)
    except OSError as e:
        raise click.BadParameter(f"{value}: cannot be read ({e.strerror or e})", param_hint="--config") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{value}: malformed TOML ({e})", param_hint="--config") from None
    except RecursionError:
        raise click.BadParameter(f"{value}: malformed TOML (nested too deeply)", param_hint="--config") from None
    table = next((k for k in ("amp-convert", "amp_convert") if k in data), None)
    if table is not None:
        outside = sorted(k for k in data if k != table)
        if outside:
            raise click.BadParameter(
                f"{value}: {outside[0]!r} is outside the [{table}] table; put every option in it "
                "(or all at the top level, without the table)",
                param_hint="--config",
            )
        data = data[table]
    if not isinstance(data, dict):
        raise click.BadParameter(f"{value}: [amp-convert] must be a table of options", param_hint="--config")
    params = {p.name: p for p in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, v in data.items():
        norm = key.replace("-", "_")
        if norm not in CONFIG_KEYS:
            raise click.BadParameter(f"{value}: unknown option {key!r}", param_hint="--config")
        name = PARAMETER_NAMES.get(norm, norm)
        if norm in MULTIPLE_KEYS:
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise click.BadParameter(f"{value}: {key} must be a string or a list of strings", param_hint="--config")
            if not v and norm in ("only_white_list", "only_black_list"):
                v = [""]  # (given empty, as the API's only_white_list=[]: click would read [] as absent)
        elif name in params:
            _check_config_number(value, key, v, params[name].type)
            _check_config_kind(value, key, v, params[name])
            try:
                params[name].type_cast_value(ctx, v)
            except (click.BadParameter, TypeError, ValueError, AttributeError) as e:
                message = e.format_message() if isinstance(e, click.ClickException) else str(e)
                raise click.BadParameter(f"{value}: {key}: {message}", param_hint="--config") from None
        defaults[name] = v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _check_config_kind(config: str, key: str, v: object, param: click.Parameter) -> None:
    """TOML values of the kind a flag or a path option takes: click would
    turn ``explain = 1`` into a string, and ``report = 5`` reach the file
    system as a number."""
    if getattr(param, "is_flag", False) and not isinstance(v, bool):
        raise click.BadParameter(f"{config}: {key} must be true or false, got {v!r}", param_hint="--config")
    if isinstance(param.type, (click.Path, click.types.StringParamType)) and not isinstance(v, str):
        raise click.BadParameter(f"{config}: {key} must be a string, got {v!r}", param_hint="--config")


def _check_config_number(config: str, key: str, v: object, kind: click.ParamType) -> None:
    """TOML numbers for numeric options: click would turn ``samples = 1.5``
    into 1 and ``atol = true`` into 1.0."""
    if isinstance(kind, click.types.IntParamType):
        wanted, types = "an integer", (int,)
    elif isinstance(kind, _Finite):
        wanted, types = "a number", (int, float)
    else:
        return
    if not isinstance(v, types) or isinstance(v, bool):
        raise click.BadParameter(f"{config}: {key} must be {wanted}, got {v!r}", param_hint="--config")


def _file_path(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Path | None:
    """An output file name; one ending in a separator (or ``.``, ``..``) names a folder."""
    if value is None:
        return None
    if os.path.basename(value) in ("", ".", ".."):
        raise click.BadParameter(f"{value}: names a directory; give a file name")
    return Path(value)


def conversion_options(f):
    """Options that decide the plan (shared by convert and lists)."""
    options = [
        click.option(
            "--level",
            type=click.Choice([*LEVELS, "auto"]),
            default=None,
            help="O0 no change; O1 only white-list ops low; O2 all but black-list ops low (default); O3 everything low; "
            "auto: the most low precision that meets the tolerance, found by measurement. Example: --level O1",
        ),
        click.option(
            "--dtype",
            type=click.Choice(["fp16", "bf16"]),
            default="fp16",
            show_default=True,
            help="Low-precision type. Example: --dtype bf16",
        ),
        click.option(
            "--lists",
            "lists_profile",
            type=click.Choice(PROFILES),
            default="default",
            show_default=True,
            help="Built-in list profile: ours, MindSpore's or Paddle's, mapped to ONNX ops. Example: --lists mindspore",
        ),
        click.option(
            "--white-list",
            multiple=True,
            metavar="OPS",
            help="Add op types to the white list (Paddle custom_white_list). Example: --white-list Add,Mul",
        ),
        click.option(
            "--black-list",
            multiple=True,
            metavar="OPS",
            help="Add op types to the black list (Paddle custom_black_list). Example: --black-list Softmax",
        ),
        click.option(
            "--only-white-list",
            multiple=True,
            metavar="OPS",
            help="Replace the white list; only these run low, as O1 (MindSpore custom_mixed_precision). "
            "Example: --only-white-list Conv,MatMul",
        ),
        click.option(
            "--only-black-list",
            multiple=True,
            metavar="OPS",
            help="Replace the black list; all but these run low, as O2. Example: --only-black-list LayerNormalization",
        ),
        click.option(
            "--keep-batchnorm-fp32/--no-keep-batchnorm-fp32",
            default=None,
            help="Keep BatchNormalization in fp32 (default: yes at O2, no at O3). Example: --no-keep-batchnorm-fp32",
        ),
        click.option(
            "--fold-batchnorm/--no-fold-batchnorm",
            default=True,
            show_default=True,
            help="Fold each BatchNormalization kept fp32 into the Conv before it, in fp32, so that no Cast pair "
            "blocks onnxruntime's fusions. Example: --no-fold-batchnorm",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amp-convert")
def cli() -> None:
    """Convert an fp32 ONNX model to mixed precision (fp16 or bf16).

    \b
      amp-convert model.onnx --level O2 -o out.onnx
      amp-convert lists --profile mindspore --level O1
    """


class _Finite(click.ParamType):
    """A finite float from ``least`` (excluded when ``above``) to ``most``: a bound or
    tolerance of NaN or infinity checks nothing, and click's FloatRange lets NaN through
    (every comparison with it is false)."""

    def __init__(self, name: str, least: float, most: float = math.inf, above: bool = False):
        self.name, self.least, self.most, self.above = name, least, most, above

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.least if self.above else number >= self.least
        if not (math.isfinite(number) and low_ok and number <= self.most):
            span = f"> {self.least:g}" if self.above else f">= {self.least:g}"
            span = span if math.isinf(self.most) else f"in [{self.least:g}, {self.most:g}]"
            self.fail(f"{value!r}: expected a finite number {span}", param, ctx)
        return number


_TOLERANCE = _Finite("tolerance", 0.0)
ERROR_STAT_CHOICES = ("max", "mean", "median", "quantile")  # (metrics.ERROR_STATS; cli imports metrics lazily)


class _Quantile(_Finite):
    """A number in (0, 1] (a _Finite, so a config file must give a number)."""

    def __init__(self) -> None:
        super().__init__("quantile", 0.0, 1.0, above=True)

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not 0.0 < number <= 1.0:  # (NaN fails too)
            self.fail(f"{value!r}: expected a number in (0, 1]", param, ctx)
        return number


def validation_options(f):
    """Options that decide how numerics are checked (shared by convert and compare)."""
    options = [
        click.option(
            "--provider",
            type=click.Choice(PROVIDERS),
            default="auto",
            show_default=True,
            help="onnxruntime provider: CUDA when a GPU is usable, else CPU. Example: --provider cpu",
        ),
        click.option(
            "--emulate",
            type=click.Choice(EMULATE_MODES),
            default="auto",
            show_default=True,
            help="Round to the low dtype at every low tensor with fp32 kernels (auto: on CPU). Example: --emulate always",
        ),
        click.option(
            "--inputs",
            multiple=True,
            metavar="PATH",
            help="Validation samples: .npz files, a folder of them, or Polygraphy input JSON (repeatable). "
            "Example: --inputs samples/",
        ),
        click.option(
            "--input-shape",
            multiple=True,
            metavar="NAME=DIMS",
            help="Shape for generated inputs with dynamic dims. Example: --input-shape input_ids=1x128",
        ),
        click.option(
            "--input-range",
            multiple=True,
            metavar="NAME=LOW:HIGH",
            help="Value range for generated inputs (integers: [LOW, HIGH)). Example: --input-range input_ids=0:30522",
        ),
        click.option("--samples", type=int, default=2, show_default=True, help="Generated samples. Example: --samples 8"),
        click.option(
            "--seed",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Seed for generated inputs. Example: --seed 3",
        ),
        click.option(
            "--atol", type=_TOLERANCE, default=None, help="Absolute tolerance (fp16 1e-3, bf16 1e-2). Example: --atol 1e-2"
        ),
        click.option(
            "--rtol",
            type=_TOLERANCE,
            default=None,
            help="Tolerance relative to the output's largest value (fp16 1e-2, bf16 5e-2). Example: --rtol 2e-2",
        ),
        click.option(
            "--min-cosine",
            type=_Finite("float", -1.0, 1.0),
            default=None,
            help="Least cosine similarity per output (fp16 0.999, bf16 0.99). Example: --min-cosine 0.995",
        ),
        click.option(
            "--check-error-stat",
            type=click.Choice(ERROR_STAT_CHOICES),
            default=None,
            help="The statistic of each output's absolute errors held to atol + rtol * max|fp32| (default max: every "
            "value). Example: --check-error-stat median",
        ),
        click.option(
            "--error-quantile",
            type=_Quantile(),
            default=None,
            help="The quantile, in (0, 1], that --check-error-stat quantile judges (default 0.99). "
            "Example: --error-quantile 0.999",
        ),
        click.option(
            "--tolerance",
            "tolerances",
            multiple=True,
            metavar="NAME:FIELD=VALUE,...",
            help="A tolerance of its own for output NAME (fields atol, rtol, min_cosine, min_top1, error_stat, "
            "quantile; the others keep the run's), repeatable. Example: --tolerance probs:atol=0.02,min_top1=0.999",
        ),
        click.option(
            "--min-top1",
            type=_Finite("float", 0.0, 1.0),
            default=None,
            help="Least share of rows whose argmax along the last axis agrees with fp32's, for float outputs whose "
            "last axis has 2 or more entries (default: reported, not judged). Example: --min-top1 0.999",
        ),
        click.option(
            "--per-node/--no-per-node",
            default=None,
            help="Compare every intermediate tensor to find where error enters (default: on up to 20,000 tensors). "
            "Example: --no-per-node",
        ),
        click.option(
            "--pin-choices/--no-pin-choices",
            default=True,
            show_default=True,
            help="Feed the converted model the fp32 model's TopK / NonMaxSuppression / NonZero / ArgMax choices, so "
            "outputs after them compare values, not tie-breaks (its own choices are reported). Example: --no-pin-choices",
        ),
        click.option(
            "--top", type=click.IntRange(min=0), default=10, show_default=True, help="Offending nodes to list. Example: --top 20"
        ),
        click.option(
            "--report",
            type=click.Path(),
            callback=_file_path,
            default=None,
            help="Write the JSON report. Example: --report report.json",
        ),
        click.option(
            "--html",
            type=click.Path(),
            callback=_file_path,
            default=None,
            help="Write the HTML report. Example: --html report.html",
        ),
        click.option("--json", "json_out", is_flag=True, help="Print the JSON report to stdout. Example: --json"),
        click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors. Example: -q"),
        click.option("--debug", is_flag=True, help="Show a traceback on errors. Example: --debug"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@cli.command("convert")
@click.argument("model", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    callback=_file_path,
    default=None,
    help="Output file (default: MODEL with a .fp16/.bf16 suffix). Example: -o out.onnx",
)
@conversion_options
@click.option(
    "--keep-fp32",
    multiple=True,
    metavar="REGEX",
    help="Keep nodes whose name matches fp32 (repeatable; beats the lists). Example: --keep-fp32 '^head/'",
)
@click.option(
    "--force-low",
    multiple=True,
    metavar="REGEX",
    help="Run nodes whose name matches low (repeatable; beats lists and safety, not the schema). Example: --force-low 'attn'",
)
@click.option(
    "--io-types",
    type=click.Choice(IO_TYPES),
    default="keep",
    show_default=True,
    help="keep: graph inputs/outputs stay fp32; low: they take the low dtype. Example: --io-types low",
)
@click.option(
    "--safety/--no-safety",
    default=None,
    help="Safety rules (on at O1, O2 and auto; off at O3): keep nodes fp32 whose constants or fp32-run values the "
    "low dtype cannot hold. Example: --no-safety",
)
@click.option(
    "--initializer-range/--no-initializer-range",
    default=True,
    show_default=True,
    help="The constants rule of --safety. Example: --no-initializer-range",
)
@click.option(
    "--clip-initializers",
    is_flag=True,
    help="Clip out-of-range constants (counted in the report) instead of keeping their nodes fp32. Example: --clip-initializers",
)
@click.option(
    "--data-max",
    type=_Finite("float", 0.0, above=True),
    default=None,
    help="Calibrated rule: nodes whose fp32 values exceed this stay fp32 (default: half the dtype's max). "
    "Example: --data-max 10000",
)
@click.option(
    "--calibration",
    multiple=True,
    metavar="PATH",
    help="Samples for the calibrated rule (default: the validation inputs); same formats as --inputs. "
    "Example: --calibration calib/",
)
@click.option(
    "--max-trials",
    type=click.IntRange(1, 1000),
    default=8,
    show_default=True,
    help="--level auto: most conversions + validations to try. Example: --max-trials 12",
)
@click.option(
    "--auto-from",
    type=click.Choice(["O1", "O2"]),
    default=None,
    help="--level auto: grow from a list level instead of shrinking from O3. Example: --auto-from O2",
)
@click.option(
    "--target-provider",
    type=str,
    default="cuda",
    show_default=True,
    help="The onnxruntime execution provider the model will run on: a node runs low only where it has a kernel for "
    "that op in the low dtype (cuda, cpu, or none for no filtering). Example: --target-provider cpu",
)
@click.option(
    "--target-opset",
    type=int,
    default=None,
    help="Upgrade the model to this default-domain opset first (bf16 Conv/MatMul need 22). Example: --target-opset 22",
)
@click.option(
    "--external-data",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Write large tensors to OUT.data beside the model: auto when the input used external data or the "
    "result is over 2 GB. Example: --external-data always",
)
@click.option(
    "--check",
    type=click.Choice(["full", "basic", "none"]),
    default="full",
    show_default=True,
    help="ONNX checker run on the result. Example: --check basic",
)
@click.option("--explain", is_flag=True, help="Print the plan: node, op, precision, reason. Example: --explain")
@click.option(
    "--plan-json",
    type=click.Path(),
    callback=_file_path,
    default=None,
    help="Write the plan as JSON. Example: --plan-json plan.json",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Check the result's numerics against the fp32 model. Example: --no-validate",
)
@click.option(
    "--write-on-fail",
    is_flag=True,
    help="Write the model even when it is out of tolerance (exit code stays 1). Example: --write-on-fail",
)
@validation_options
@click.option(
    "--config",
    type=click.Path(path_type=str),
    callback=_load_config,
    is_eager=True,
    expose_value=False,
    help="TOML file with any of these options (flags given here override it). Example: --config amp.toml",
)
def convert_command(model: Path, output: Path | None, **kw: Any) -> None:
    """Convert MODEL to mixed precision, validate it, report, save."""
    from .check import check_file
    from .external import payload
    from .load import check_input_model, read_model
    from .pipeline import convert
    from .report import build_report, clipping_summary
    from .save import TextFiles, save_model

    auto = kw["level"] == "auto"
    options = _conversion_options(kw)
    output = output or _default_output(model, options.dtype)
    if auto and not kw["validate"]:
        raise AmpError("--level auto measures accuracy: it cannot run with --no-validate")
    if not auto:  # (a config file may hold them for the runs that are auto: only flags are refused)
        given = click.get_current_context().get_parameter_source
        for name in ("max_trials", "auto_from"):
            if given(name) is click.core.ParameterSource.COMMANDLINE:
                raise AmpError(
                    f"--{name.replace('_', '-')} applies to --level auto only (the level is {options.effective_level})"
                )
    start = options.auto_start(kw["auto_from"]) if auto else None
    loaded = read_model(model, lazy_external=True)
    remember_inputs([*kw["inputs"], *kw["calibration"]])
    with loaded.checked():
        reference = loaded.model
        # Every output is checked before anything is converted or written.
        targets = {"-o": output, "-o's data file": output.with_name(f"{output.name}.data")}
        reports = (("--plan-json", "plan_json"), ("--report", "report"), ("--html", "html"))
        _check_outputs([model], {**targets, **{flag: kw[key] for flag, key in reports}}, unchecked=("-o's data file",))
        folder = model.parent
        input_files = loaded.external_files
        input_external = bool(input_files)
        node_count = len(reference.graph.node)
        size_before = _files_size(model, input_files)
        calibrating = auto or options.safety_on  # (the calibrated rule is on: its samples are read)
        _check_unused(reference, kw, validating=kw["validate"], calibrating=calibrating and bool(kw["calibration"]))
        source = _input_source(reference, kw) if kw["validate"] else None
        calibration_source, samples = (
            _calibration_samples(reference, kw) if calibrating and kw["calibration"] else (source, source)
        )
        input_loads = partial(_input_loads, reference, kw, folder, source)  # (asked where a failure may be the input's)
        if source is not None and options.target_opset is not None:
            _check_target_runs(reference, options.target_opset, input_loads)
        calibration = _calibration(reference, samples, calibration_source, kw, folder) if calibrating else None
        searched = None
        if auto:
            with _run_failures(source, check=kw["check"]):
                searched = _auto(reference, options, start, source, calibration, kw, folder)
            result, validation = searched.conversion, searched.validation
        else:
            # Without validation the fp32 model is not needed afterwards: convert it in place.
            with _stage_line(kw) as on_stage:
                result = convert(
                    reference,
                    options,
                    check=kw["check"],
                    calibration=calibration,
                    in_place=source is None,
                    external_dir=folder,
                    on_stage=on_stage,
                )
            with _run_failures(source, check=kw["check"]):
                validation = (
                    _validate(reference, result.model, source, kw, result.plan, folder, calibration, options.dtype)
                    if source is not None
                    else None
                )
            if calibration is not None:
                calibration.session = None  # (its memory goes before the model is written)
    if kw["calibration"] and not calibrating:
        rules = "--no-safety" if options.safety is False else f"at {options.effective_level}; --safety turns them on"
        result.plan.notes.append(f"--calibration not read: the safety rules, which use it, are off ({rules})")
    if kw["explain"] and not kw["json_out"]:
        click.echo(result.plan.format_table())
    passed = validation is None or validation.passed
    exit_code = EXIT_OK if passed else EXIT_TOLERANCE
    write = passed or kw["write_on_fail"]
    # The conversion makes no tensor external: a model read without any is
    # serialized once, here, and those bytes are written if it is one file.
    one_file = write and not input_external and kw["external_data"] != "always"
    measured = payload(result.model, may_be_external=not one_file)
    size_after = measured.total
    timings = dict(result.timings)
    if validation is not None:
        timings["validate"] = validation.seconds
    if searched is not None:
        timings = {"auto_search": searched.seconds}
    report_of = partial(
        build_report,
        command="convert",
        model_path=model,
        model_nodes=node_count,
        output_path=output,
        written=write,
        options={**options.as_dict(), "level": kw["level"] or options.effective_level},
        conversion=result,
        validation=validation,
        inputs=None if source is None else source.describe(),
        timings=timings,
        size_before=size_before,
        exit_code=exit_code,
        auto=None if searched is None else searched.as_dict(),
    )
    made: list[dict] = []
    with TextFiles() as side_files:

        def write_reports(size: int) -> None:
            """The report, made once the written size is known, and every file asked for beside the model, written
            (in place only once the model is: a failure writing any of them writes nothing)."""
            made.append(report_of(size_after=size))
            if kw["plan_json"]:
                side_files.write(kw["plan_json"], result.plan.to_json())
            _write_reports(side_files, made[0], kw)

        if write:
            mode = kw["external_data"]
            external = mode == "always" or (mode == "auto" and (input_external or size_after > PROTOBUF_LIMIT))
            deferred = result.check_deferred
            # Written as the bytes measured, the file's size is known; else it is read off the written files.
            exact = not external and measured.serialized is not None
            written: list[int] = [size_after] if exact else []

            def verify(path: Path) -> None:
                if deferred:  # too large to check in memory: check the written file before it replaces anything
                    try:
                        check_file(path, kw["check"])
                    except ConversionError:
                        if kw["check"] == "full":  # (blame the input when it fails the full check already: exit 2)
                            check_input_model(str(model), str(model), full_check=True)
                        raise
                if not exact:
                    data = path.with_name(f"{output.name}.data")
                    written.append(path.stat().st_size + (data.stat().st_size if external and data.is_file() else 0))

            save_model(
                result.model,
                output,
                external=external,
                source_dir=folder,
                before_commit=verify,
                measured=measured,
                meanwhile=lambda: write_reports(written[0]),  # (while the model is flushed to disk)
            )
        else:
            write_reports(size_after)
        side_files.place()
    report = made[0]
    _echo_reports(report, kw)
    if not kw["quiet"] and not kw["json_out"]:
        clipping = clipping_summary(report)
        if clipping:
            click.echo(clipping)
        for hint in result.plan.hints:
            click.echo(f"hint: {hint}")
        covered = report["plan"]["coverage"]
        if covered["warning"]:
            click.echo(covered["warning"], err=True)
        c = report["plan"]["counts"]
        level = f"auto ({searched.tried}, {searched.low_compute:.1%} of compute low)" if searched else result.plan.level
        share = "" if searched else f" ({covered['summary']})"
        click.echo(
            f"{model} -> {output if write else '(not written: out of tolerance; --write-on-fail writes it)'}: "
            f"{level} {options.dtype}, "
            f"{c['low']} low / {c['fp32']} fp32 / {c['unchanged']} unchanged nodes{share}, "
            f"casts {result.casts_before} -> {result.casts_after}, "
            f"{_mb(size_before)} -> {_mb(size_after)}, {sum(timings.values()):.2f} s"
        )
    if exit_code:
        raise click.exceptions.Exit(exit_code)


@contextlib.contextmanager
def _stage_line(kw: dict):
    """On a terminal, one status line that names the stage done (large graphs
    take seconds); nothing under --quiet, --json or when not a terminal."""
    if kw["quiet"] or kw["json_out"] or not sys.stderr.isatty():
        yield None
        return
    started = time.perf_counter()

    def show(stage: str) -> None:
        click.echo(f"\r\033[Kconverting: {stage} done ({time.perf_counter() - started:.1f} s)", err=True, nl=False)

    try:
        yield show
    finally:
        click.echo("\r\033[K", err=True, nl=False)


def _conversion_options(kw: dict) -> ConvertOptions:
    return ConvertOptions(
        level=None if kw["level"] == "auto" else kw["level"],
        dtype=kw["dtype"],
        lists=kw["lists_profile"],
        white_list=_split_ops(kw["white_list"]),
        black_list=_split_ops(kw["black_list"]),
        only_white_list=_only_list(kw["only_white_list"]),
        only_black_list=_only_list(kw["only_black_list"]),
        keep_fp32=tuple(kw["keep_fp32"]),
        force_low=tuple(kw["force_low"]),
        keep_batchnorm_fp32=kw["keep_batchnorm_fp32"],
        fold_batchnorm=kw["fold_batchnorm"],
        io_types=kw["io_types"],
        safety=kw["safety"],
        initializer_range=kw["initializer_range"],
        clip_initializers=kw["clip_initializers"],
        data_max=kw["data_max"],
        target_opset=kw["target_opset"],
        target_provider=kw["target_provider"].lower(),
    ).validated()


def _only_list(values: tuple[str, ...]) -> tuple[str, ...] | None:
    """An --only-*-list given, even as ``""``, replaces the built-in list (an empty one, as
    the API's ``only_white_list=[]``); None when the option is absent."""
    return _split_ops(values) if values else None


@contextlib.contextmanager
def _run_failures(source, names: tuple[str, str] | None = None, check: str = "full") -> Iterator[None]:
    """A model onnxruntime could not load, or run on the samples of
    ``source``, named, with what to try where the samples may be to blame
    (exit 2; compare names both files where neither loads). ``names``:
    what to call the reference and the candidate (compare's files); None in
    convert, whose candidate is the converted model (as validation runs it:
    exposed, or its emulation twin): its failure where the input model
    loaded and ran is the conversion's (exit 3).
    An emulation twin onnxruntime cannot load, where it loads the model
    itself, is amp-convert's failure (exit 3), whichever model it emulates.
    So is a converted model onnxruntime refuses as written (``check``: the
    checker's mode it passed, which the message says)."""
    try:
        yield
    except ModelFailure as e:
        if e.role is None:
            raise
        reference, candidate = names or ("the input model", "the converted model")
        if isinstance(e, TwinFailure):
            emulated = reference if e.role == "reference" else candidate
            raise ConversionError(
                f"onnxruntime cannot load the emulation twin of {emulated} (the float32 copy amp-convert builds to "
                f"round as its fp16/bf16 tensors do), though it loads {emulated} as written; --emulate never "
                f"validates without it: {e.detail}"
            ) from None
        if isinstance(e, NeitherLoads) and names is not None:
            both = e.detail if e.other == e.detail else f"{reference}: {e.detail}; {candidate}: {e.other}"
            raise AmpError(f"neither {reference} nor {candidate} can be loaded by onnxruntime: {both}") from None
        if isinstance(e, RefusedAsWritten) and names is None and e.role == "candidate":
            raise ConversionError(_refused_converted(e, check)) from None
        loading = isinstance(e, LoadFailure)
        failed = "cannot be loaded by onnxruntime" if loading else "fails to run"
        if e.role == "reference":
            raise AmpError(f"{reference} {failed}{'' if loading else source.failure_hint()}: {e.detail}") from None
        if names is None:
            raise ConversionError(f"{candidate} {failed} where the input model runs: {e.detail}") from None
        raise AmpError(f"{candidate} {failed} where {reference} runs: {e.detail}") from None


def _refused_converted(refused: RefusedAsWritten, check: str) -> str:
    """The line for a converted model onnxruntime refuses as written (the
    pipeline's checker passed it in mode ``check``)."""
    import onnxruntime

    prefix = f"onnxruntime {onnxruntime.__version__} cannot load the converted model on {refused.provider}"
    if check == "none":
        return (
            f"{prefix} ({refused.detail}); onnx's checker has not run on it (--check none): --check full tells "
            "whether the conversion made it invalid"
        )
    return f"{prefix}, which is valid ONNX: {refused.detail}; try another level, or keep the nodes it involves fp32 (--keep-fp32)"


def _calibration_samples(reference, kw: dict) -> tuple[Any, Iterator[dict]]:
    """--calibration's source and its samples, the first one read (and
    checked against the model) now: files that hold none are refused before
    any onnxruntime session is built or anything converted (else the
    calibrated rule would be off without a word)."""
    from .inputs import make_source

    given = make_source(
        reference, kw["calibration"], kw["input_shape"], kw["input_range"], kw["samples"], kw["seed"], flag="--calibration"
    )
    samples = iter(given)
    first = next(samples)  # (files holding no sample are refused here: see InputSource)
    return given, chain([first], samples)


def _calibration(reference, samples, source, kw: dict, folder: Path):
    """fp32 value ranges for the calibrated safety rule (one streaming pass
    over ``samples``, from ``source``: --calibration's, else the validation inputs)."""
    if samples is None:
        return None
    from .calibrate import calibrate

    with _run_failures(source):
        return calibrate(reference, samples, kw["provider"], base_dir=folder, emulate=kw["emulate"])


def _check_unused(reference, kw: dict, validating: bool, calibrating: bool) -> None:
    """Sample options this run does not read (``calibrating``: whether it reads --calibration)
    are vetted all the same: a missing file, an unknown input name exit 2, as where they are read."""
    options = (("--inputs", kw["inputs"], validating), ("--calibration", kw["calibration"], calibrating))
    unread = [(flag, given) for flag, given, read in options if given and not read]
    names = not (validating or calibrating) and (kw["input_shape"] or kw["input_range"])
    if not (unread or names):  # (nothing to vet: the inputs module stays unloaded)
        return
    from .inputs import check_unused

    for flag, given in unread:
        check_unused(reference, given, flag)
    if names:
        check_unused(reference, shapes=kw["input_shape"], ranges=kw["input_range"])


def _auto(reference, options: ConvertOptions, start: str, source, calibration, kw: dict, folder: Path):
    from .auto import auto_convert
    from .validate import ValidationConfig

    def show(trial) -> None:
        if not kw["quiet"] and not kw["json_out"]:
            verdict = "pass" if trial.passed else "fail"
            click.echo(f"trial {trial.number}: {trial.step}: {verdict}, {trial.low_compute:.1%} of compute low", err=True)

    tolerance = _tolerance(kw, reference_low=options.dtype)
    config = ValidationConfig(
        kw["provider"],
        kw["emulate"],
        True,
        kw["top"],
        tolerance,
        kw["pin_choices"],
        options.dtype,
        target_provider=options.target_provider,
        tolerances=_per_output_tolerances(kw),
    )
    searched = auto_convert(reference, options, source, config, calibration, kw["max_trials"], start, kw["check"], show, folder)
    if not searched.validation.passed and not kw["quiet"] and not kw["json_out"]:
        click.echo(
            f"auto: no low-precision assignment met the tolerance in {searched.tried}; "
            f"the closest, trial {searched.chosen}, fails as shown (--write-on-fail writes it)"
        )
    return searched


@cli.command("compare")
@click.argument("reference", type=click.Path(dir_okay=True, path_type=Path))
@click.argument("candidate", type=click.Path(dir_okay=True, path_type=Path))
@validation_options
def compare_command(reference: Path, candidate: Path, **kw: Any) -> None:
    """Compare CANDIDATE (e.g. converted by another tool) with REFERENCE."""
    from .load import read_model
    from .report import build_report
    from .save import TextFiles

    ref_loaded, cand_loaded = read_model(reference), read_model(candidate)  # (external data read into memory: the two
    ref_model, cand_model = ref_loaded.model, cand_loaded.model  # may live in different folders)
    remember_inputs(kw["inputs"])
    _check_outputs([reference, candidate], {"--report": kw["report"], "--html": kw["html"]})
    source = _input_source(ref_model, kw)
    with _run_failures(source, (str(reference), str(candidate))):
        validation = _validate(ref_model, cand_model, source, kw, None)
    exit_code = EXIT_OK if validation.passed else EXIT_TOLERANCE
    report = build_report(
        command="compare",
        model_path=reference,
        model_nodes=len(ref_model.graph.node),
        output_path=candidate,
        written=False,
        options=None,
        validation=validation,
        inputs=source.describe(),
        timings={"validate": validation.seconds},
        size_before=_files_size(reference, ref_loaded.external_files),
        size_after=_files_size(candidate, cand_loaded.external_files),
        exit_code=exit_code,
    )
    with TextFiles() as files:
        _write_reports(files, report, kw)
        files.place()
    _echo_reports(report, kw)
    if exit_code:
        raise click.exceptions.Exit(exit_code)


def _input_source(reference, kw: dict):
    """The validation inputs; where the user gave no input option, the line
    saying what is generated is printed."""
    from .inputs import make_source

    source = make_source(reference, kw["inputs"], kw["input_shape"], kw["input_range"], kw["samples"], kw["seed"])
    if not (kw["inputs"] or kw["input_shape"] or kw["input_range"] or kw["quiet"] or kw["json_out"]):
        click.echo(source.summary())
    return source


def _validate(reference, candidate, source, kw: dict, plan, folder: Path | None = None, calibration=None, dtype=None):
    """``dtype``: the conversion's low dtype (None for compare: the candidate's, as detected)."""
    from .emulate import detect_low_dtype
    from .validate import ValidationConfig, validate

    dtype = dtype or ("bf16" if detect_low_dtype(candidate) == 16 else "fp16")
    tolerance = _tolerance(kw, reference_low=dtype)
    aimed_at = kw.get("target_provider", "cuda").lower()  # (compare: a candidate of another tool, aimed at CUDA)
    config = ValidationConfig(
        kw["provider"],
        kw["emulate"],
        kw["per_node"],
        kw["top"],
        tolerance,
        kw["pin_choices"],
        dtype,
        target_provider=aimed_at,
        tolerances=_per_output_tolerances(kw),
    )
    show = not kw["quiet"] and not kw["json_out"] and sys.stderr.isatty()
    if not show:
        return validate(reference, candidate, source, config, plan, base_dir=folder, calibration=calibration)
    with click.progressbar(length=source.count() or 1, label="validating", file=sys.stderr) as bar:
        return validate(reference, candidate, source, config, plan, progress=bar.update, base_dir=folder, calibration=calibration)


def _check_target_runs(model, target: int, input_loads: Callable[[], None]) -> None:
    """Validation runs the model at the opset --target-opset asks for: one
    onnxruntime cannot load is refused before anything is converted (else
    its refusal would read as a conversion's failure), unless the input
    does not load either (``input_loads`` raises): an IR version newer than
    onnxruntime reads is the input's, which no opset would change."""
    import onnxruntime

    from .opset import min_ir_for_opset
    from .runner import version_refusal

    ir_version = max(model.ir_version, min_ir_for_opset(target))
    refusal = version_refusal(target, ir_version)
    if refusal is not None:
        input_loads()
        raise AmpError(
            f"--target-opset {target}: onnxruntime {onnxruntime.__version__} loads no model at opset {target} "
            f"(IR version {ir_version}): {refusal}; give a lower --target-opset, or --no-validate to write it unvalidated"
        )


def _input_loads(reference, kw: dict, folder: Path, source) -> None:
    """Load the input as validation runs it: where onnxruntime cannot, an
    AmpError naming the input (through :func:`_run_failures`)."""
    from .emulate import detect_low_dtype
    from .runner import choose_provider, runnable

    provider, _ = choose_provider(kw["provider"])
    with _run_failures(source):
        runnable(reference, detect_low_dtype(reference), provider, kw["emulate"], (), folder, "reference")


def _tolerance(kw: dict, reference_low: str):
    """User tolerances over the dtype's defaults (None: all defaults).
    --error-quantile without --check-error-stat quantile is refused."""
    from .metrics import DEFAULT_TOLERANCES, Tolerance

    stat = kw["check_error_stat"] or "max"
    if kw["error_quantile"] is not None and stat != "quantile":
        raise AmpError(f"--error-quantile applies to --check-error-stat quantile only (the statistic is {stat})")
    if all(kw[k] is None for k in ("atol", "rtol", "min_cosine", "min_top1", "check_error_stat")):
        return None
    base = DEFAULT_TOLERANCES[reference_low]
    return Tolerance(
        atol=base.atol if kw["atol"] is None else kw["atol"],
        rtol=base.rtol if kw["rtol"] is None else kw["rtol"],
        min_cosine=base.min_cosine if kw["min_cosine"] is None else kw["min_cosine"],
        min_equal=base.min_equal,
        min_top1=kw["min_top1"],
        error_stat=stat,
        quantile=kw["error_quantile"],
    )


def _per_output_tolerances(kw: dict) -> dict[str, dict[str, float]]:
    from .metrics import parse_tolerances

    return parse_tolerances(kw["tolerances"])


def _write_reports(files: TextFiles, report: dict, kw: dict) -> None:
    from .report import html_report, report_json

    if kw["report"]:
        files.write(kw["report"], report_json(report))
    if kw["html"]:
        files.write(kw["html"], html_report(report))


def _echo_reports(report: dict, kw: dict) -> None:
    from .report import report_json, terminal_table

    if kw["json_out"]:
        click.echo(report_json(report))
    elif not kw["quiet"] and report["validation"] is not None:
        click.echo(terminal_table(report))


@cli.command("lists")
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    default="default",
    show_default=True,
    help="List profile. Example: --profile paddle",
)
@click.option(
    "--level",
    type=click.Choice(LEVELS),
    default="O2",
    show_default=True,
    help="Level the lists apply to. Example: --level O1",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp16", "bf16"]),
    default="fp16",
    show_default=True,
    help="Low dtype. Example: --dtype bf16",
)
def lists_command(profile: str, level: str, dtype: str) -> None:
    """Print the white, black and follow lists in force, with reasons."""
    lists = ConvertOptions(level=level, dtype=dtype, lists=profile).validated().op_lists()
    click.echo(f"# profile {profile}, level {level}, dtype {dtype}")
    if level == "O0":
        click.echo("\nO0 changes nothing: every op keeps its precision (the lists apply from O1 on)")
        return
    if level == "O3":  # (the plan's O3 rule comes before the white and follow lists: shown, they would mislead)
        click.echo(
            "\nO3 runs every op low: no list applies (when converting, --black-list and --keep-batchnorm-fp32 keep "
            "ops fp32, and an op's schema may)"
        )
        return
    quantized = dict.fromkeys(sorted(ORT_QUANTIZED_OPS), "onnxruntime's quantized op: never touched")
    tables = (("white", lists.white), ("black", lists.black), ("follow", lists.follow), ("quantized", quantized))
    width = max(len(op) for _, table in tables for op in table)
    for title, table in tables:
        click.echo(f"\n{title} ({len(table)}):")
        for op in sorted(table):
            click.echo(f"  {op:{width}s} {table[op]}")
    unlisted = "follow their inputs" if lists.unlisted_follow else ("fp32" if level == "O1" else "low")
    click.echo(f"\nunlisted ops: {unlisted} at {level}")


def _files_size(model: Path, data_files: Iterable[str]) -> int:
    """Bytes of a model file and of the external data files (named relative to its folder) it was read with."""
    return model.stat().st_size + sum((model.parent / f).stat().st_size for f in data_files if (model.parent / f).is_file())


def _default_output(model: Path, dtype: str) -> Path:
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    return model.with_name(f"{stem}.{dtype}.onnx")


def _check_outputs(models: list[Path], targets: dict[str, Path | None], unchecked: Iterable[str] = ()) -> None:
    """Refuse, before anything is written, an output given (by flag) that is
    one of ``models`` or cannot be written as a file (``unchecked``: flags
    whose path is not looked at, only compared), or two outputs of one file."""
    seen: dict[Path, str] = {}
    for flag, target in targets.items():
        if target is None:
            continue
        if flag not in unchecked:
            for model in models:
                _check_output_path(model, target, flag)
        key = target.resolve()
        if key in seen:
            raise AmpError(f"{target}: given as both {seen[key]} and {flag}; each output needs its own file")
        seen[key] = flag


def _check_output_path(model: Path, output: Path, flag: str) -> None:
    """Refuse the path given to ``flag`` (named in the message) when it is the
    input model or cannot be written as a file."""
    from .save import check_output_path

    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise AmpError(f"{flag} {output}: output is the input file; choose another {flag} (the input is never overwritten)")
    try:
        check_output_path(output)
    except AmpError as e:
        raise AmpError(f"{flag} {e}") from None


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every failure into one line and an
    exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    try:
        code = cli.main(args=args, prog_name="amp-convert", standalone_mode=False)
        return code if isinstance(code, int) else EXIT_OK
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("amp-convert: interrupted", err=True)
        return 130
    except click.UsageError as e:
        if isinstance(e, _NO_ARGS):  # (no arguments: the help, as it reads, not folded into one line)
            click.echo(e.format_message(), err=True)
            return EXIT_USAGE
        return _fail(f"{e.format_message()}", EXIT_USAGE, debug)
    except click.ClickException as e:
        return _fail(e.format_message(), EXIT_USAGE, debug)
    except AmpError as e:
        return _fail(str(e), EXIT_USAGE, debug)
    except ConversionError as e:
        return _fail(str(e), EXIT_INTERNAL, debug)
    except KeyboardInterrupt:
        click.echo("amp-convert: interrupted", err=True)
        return 130
    except Exception as e:
        if isinstance(e, OSError) and e.filename is not None:  # a path the system refuses (too long ...): the user's to change
            name = os.fsdecode(e.filename) if isinstance(e.filename, bytes) else str(e.filename)
            return _fail(f"{name}: {e.strerror or e}; nothing was written", EXIT_USAGE, debug)
        # a bug: still one line unless --debug
        return _fail(f"internal error: {type(e).__name__}: {e} (run with --debug for a traceback)", EXIT_INTERNAL, debug)


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    first = " ".join(message.split())
    click.echo(f"amp-convert: error: {first}", err=True)
    return code


def command() -> None:
    """The ``amp-convert`` command: :func:`main`, its return the exit status."""
    raise SystemExit(main())
