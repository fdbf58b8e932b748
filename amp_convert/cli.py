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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from .errors import AmpError, ConversionError
from .lists import LEVELS, ORT_QUANTIZED_OPS, PROFILES
from .options import EMULATE_MODES, ERROR_STATS, IO_TYPES, PROVIDERS, ConvertOptions
from .version import __version__

EXIT_OK, EXIT_TOLERANCE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # (click 8.2 on; 8.1 prints the help itself)

NOT_CONFIG = ("config", "debug")  # options a config file cannot set


def _parameters(command: click.Command) -> dict[str, click.Option]:
    """A command's options by key: the first long name, ``-`` as ``_``
    (``--tolerance`` -> tolerance). The keys are the config file's and the
    library options' field names."""
    found = {}
    for param in command.params:
        if isinstance(param, click.Option):
            longs = [o for o in param.opts if o.startswith("--")]
            found[longs[0][2:].replace("-", "_") if longs else param.name] = param
    return found


def _flag(key: str, params: dict[str, click.Option]) -> str:
    """How the command line spells the option of field ``key`` (as declared first: -o for output)."""
    param = params.get(key)
    return key if param is None else param.opts[0]


def _spelled_as_flags(message: str, command: click.Command | None) -> str:
    """A library message with each backquoted field (`` `data_max` ``) as its
    flag (--data-max); `` `validate` false `` as the flag's off switch."""
    import re

    params = _parameters(command) if command is not None else {}

    def flag(match: re.Match) -> str:
        key, false = match.group(1), match.group(2)
        param = params.get(key)
        if false and param is not None and param.secondary_opts:
            return param.secondary_opts[0]
        return _flag(key, params) + (false or "")

    return re.sub(r"`([a-z_0-9]+)`( false)?", flag, message)


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
        from .load import remember_inputs

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
    by_key = {k: p for k, p in _parameters(ctx.command).items() if k not in NOT_CONFIG}
    params = {p.name: p for p in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, v in data.items():
        norm = key.replace("-", "_")
        if norm not in by_key:
            raise click.BadParameter(f"{value}: unknown option {key!r}", param_hint="--config")
        name = by_key[norm].name
        if by_key[norm].multiple:
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
            type=click.Choice(ERROR_STATS),
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
    from .options import AutoOptions, OutputOptions
    from .workflow import convert_file

    auto = kw["level"] == "auto"
    if not auto:  # (a config file may hold them for the runs that are auto: only flags are refused)
        given = click.get_current_context().get_parameter_source
        for name in ("max_trials", "auto_from"):
            if given(name) is click.core.ParameterSource.COMMANDLINE:
                level = kw["level"] or ("O1" if kw["only_white_list"] else "O2")
                raise AmpError(f"--{name.replace('_', '-')} applies to --level auto only (the level is {level})")
    outputs = OutputOptions(output, kw["external_data"], kw["write_on_fail"], kw["plan_json"], kw["report"], kw["html"])
    with _stage_line(kw) as on_stage:
        run = convert_file(
            model,
            _conversion_options(kw),
            validation=_validation_options(kw),
            validate=kw["validate"],
            auto=AutoOptions(kw["max_trials"], kw["auto_from"]) if auto else None,
            outputs=outputs,
            check=kw["check"],
            hooks=_hooks(kw, on_stage),
        )
    talk = not kw["quiet"] and not kw["json_out"]
    if run.auto is not None and not run.passed and talk:
        failing = run.auto.failures()
        click.echo(
            f"auto: no low-precision assignment met the tolerance in {run.auto.tried}; the closest, "
            f"trial {run.auto.chosen}, fails {'on ' + failing if failing else 'as shown'} (--write-on-fail writes it)"
        )
    if kw["explain"] and not kw["json_out"]:
        click.echo(run.conversion.plan.format_table())
    _echo_reports(run.report, kw)
    if talk:
        _echo_summary(run, model)
    if not run.passed:
        raise click.exceptions.Exit(EXIT_TOLERANCE)


def _echo_summary(run, model: Path) -> None:
    """What the conversion did, after the report: clipping, hints, the coverage warning, one summary line."""
    from .report import clipping_summary

    report, result = run.report.data, run.conversion
    clipping = clipping_summary(report)
    if clipping:
        click.echo(clipping)
    for hint in result.plan.hints:
        click.echo(f"hint: {hint}")
    covered = report["plan"]["coverage"]
    if covered["warning"]:
        click.echo(covered["warning"], err=True)
    c, size = report["plan"]["counts"], report["size"]
    searched = run.auto
    level = f"auto ({searched.tried}, {searched.low_compute:.1%} of compute low)" if searched else result.plan.level
    share = "" if searched else f" ({covered['summary']})"
    written = run.output if run.written else "(not written: out of tolerance; --write-on-fail writes it)"
    click.echo(
        f"{model} -> {written}: {level} {result.plan.dtype}, "
        f"{c['low']} low / {c['fp32']} fp32 / {c['unchanged']} unchanged nodes{share}, "
        f"casts {result.casts_before} -> {result.casts_after}, "
        f"{_mb(size['before_bytes'])} -> {_mb(size['after_bytes'])}, {sum(report['timing_s'].values()):.2f} s"
    )


def _hooks(kw: dict, on_stage: Callable[[str], None] | None = None):
    """What the terminal shows as a run goes: the generated-inputs line, the
    stage line, auto's trials and the validation progress bar (none of it
    under --quiet or --json; the line and the bar only on a terminal)."""
    from .workflow import Hooks

    if kw["quiet"] or kw["json_out"]:
        return Hooks()

    def trial(t) -> None:
        verdict = "pass" if t.passed else "fail"
        click.echo(f"trial {t.number}: {t.step}: {verdict}, {t.low_compute:.1%} of compute low", err=True)

    @contextlib.contextmanager
    def validating(count: int | None) -> Iterator[Callable[[int], None]]:
        click.echo("\r\033[K", err=True, nl=False)  # (the stage line goes)
        with click.progressbar(length=count or 1, label="validating", file=sys.stderr) as bar:
            yield bar.update

    return Hooks(inputs=click.echo, stage=on_stage, trial=trial, validating=validating if sys.stderr.isatty() else None)


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
    )


def _validation_options(kw: dict):
    """The validation options group as the library's ValidationOptions (fields named as the options)."""
    from dataclasses import fields

    from .options import ValidationOptions

    params = _parameters(click.get_current_context().command)
    given = {f.name: kw[params[f.name].name] for f in fields(ValidationOptions) if f.name in params}
    return ValidationOptions(**given)


def _only_list(values: tuple[str, ...]) -> tuple[str, ...] | None:
    """An --only-*-list given, even as ``""``, replaces the built-in list (an empty one, as
    the API's ``only_white_list=[]``); None when the option is absent."""
    return _split_ops(values) if values else None


@cli.command("compare")
@click.argument("reference", type=click.Path(dir_okay=True, path_type=Path))
@click.argument("candidate", type=click.Path(dir_okay=True, path_type=Path))
@validation_options
def compare_command(reference: Path, candidate: Path, **kw: Any) -> None:
    """Compare CANDIDATE (e.g. converted by another tool) with REFERENCE."""
    from .options import OutputOptions
    from .workflow import compare_files

    outputs = OutputOptions(report=kw["report"], html=kw["html"])
    run = compare_files(reference, candidate, _validation_options(kw), outputs=outputs, hooks=_hooks(kw))
    _echo_reports(run.report, kw)
    if not run.passed:
        raise click.exceptions.Exit(EXIT_TOLERANCE)


def _echo_reports(report, kw: dict) -> None:
    if kw["json_out"]:
        click.echo(report.to_json())
    elif not kw["quiet"] and report.data["validation"] is not None:
        click.echo(report.to_text())


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
        return _fail(_spelled_as_flags(str(e), _invoked(args)), EXIT_USAGE, debug)
    except ConversionError as e:
        return _fail(_spelled_as_flags(str(e), _invoked(args)), EXIT_INTERNAL, debug)
    except KeyboardInterrupt:
        click.echo("amp-convert: interrupted", err=True)
        return 130
    except Exception as e:
        if isinstance(e, OSError) and e.filename is not None:  # a path the system refuses (too long ...): the user's to change
            name = os.fsdecode(e.filename) if isinstance(e.filename, bytes) else str(e.filename)
            return _fail(f"{name}: {e.strerror or e}; nothing was written", EXIT_USAGE, debug)
        # a bug: still one line unless --debug
        return _fail(f"internal error: {type(e).__name__}: {e} (run with --debug for a traceback)", EXIT_INTERNAL, debug)


def _invoked(args: list[str]) -> click.Command | None:
    """The subcommand ``args`` run (the default one unless named)."""
    return cli.commands.get(args[0] if args and args[0] in cli.commands else DefaultCommandGroup.default_command)


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    first = " ".join(message.split())
    click.echo(f"amp-convert: error: {first}", err=True)
    return code


def command() -> None:
    """The ``amp-convert`` command: :func:`main`, its return the exit status."""
    raise SystemExit(main())
