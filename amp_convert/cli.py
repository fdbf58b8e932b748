"""Command line: ``amp-convert MODEL --level O2 -o OUT`` and friends.

Options come in groups shared by the commands (as Polygraphy's tools share
argument groups). Every user error is one line on stderr and exit code 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import AmpError, ConversionError
from .lists import LEVELS, PROFILES
from .options import IO_TYPES, ConvertOptions

EXIT_OK, EXIT_TOLERANCE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

# Config-file keys: the long option names, with '-' or '_'.
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
    "io_types",
    "safety",
    "check",
    "target_opset",
    "output",
    "explain",
    "plan_json",
    "quiet",
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
    if not path.is_file():
        raise click.BadParameter(f"{value}: no such file", param_hint="--config")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{value}: malformed TOML ({e})", param_hint="--config") from None
    section = data.get("amp-convert", data.get("amp_convert", data))
    defaults: dict[str, Any] = {}
    for key, v in section.items():
        norm = key.replace("-", "_")
        if norm not in CONFIG_KEYS:
            raise click.BadParameter(f"{value}: unknown option {key!r}", param_hint="--config")
        if norm in ("white_list", "black_list", "keep_fp32", "force_low", "only_white_list", "only_black_list"):
            v = [v] if isinstance(v, str) else list(v)
        defaults[norm] = v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def conversion_options(f):
    """Options that decide the plan (shared by convert and lists)."""
    options = [
        click.option(
            "--level",
            type=click.Choice(LEVELS),
            default=None,
            help="O0 no change; O1 only white-list ops low; O2 all but black-list ops low (default); O3 everything low. "
            "Example: --level O1",
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


@cli.command("convert")
@click.argument("model", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
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
    default=True,
    show_default=True,
    help="O1/O2: keep nodes fp32 whose constants the low dtype cannot represent. Example: --no-safety",
)
@click.option(
    "--target-opset",
    type=int,
    default=None,
    help="Upgrade the model to this default-domain opset first (bf16 Conv/MatMul need 22). Example: --target-opset 22",
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
    "--plan-json", type=click.Path(path_type=Path), default=None, help="Write the plan as JSON. Example: --plan-json plan.json"
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors. Example: -q")
@click.option("--debug", is_flag=True, help="Show a traceback on errors. Example: --debug")
@click.option(
    "--config",
    type=click.Path(path_type=str),
    callback=_load_config,
    is_eager=True,
    expose_value=False,
    help="TOML file with any of these options (flags given here override it). Example: --config amp.toml",
)
def convert_command(model: Path, output: Path | None, **kw: Any) -> None:
    """Convert MODEL to mixed precision."""
    from .pipeline import convert
    from .save import save_model, write_text

    options = ConvertOptions(
        level=kw["level"],
        dtype=kw["dtype"],
        lists=kw["lists_profile"],
        white_list=_split_ops(kw["white_list"]),
        black_list=_split_ops(kw["black_list"]),
        only_white_list=_split_ops(kw["only_white_list"]) or None,
        only_black_list=_split_ops(kw["only_black_list"]) or None,
        keep_fp32=tuple(kw["keep_fp32"]),
        force_low=tuple(kw["force_low"]),
        keep_batchnorm_fp32=kw["keep_batchnorm_fp32"],
        io_types=kw["io_types"],
        initializer_range=kw["safety"],
        target_opset=kw["target_opset"],
    ).validated()
    output = output or _default_output(model, options.dtype)
    _check_output_path(model, output)
    result = convert(model, options, check=kw["check"])
    if kw["explain"]:
        click.echo(result.plan.format_table())
    if kw["plan_json"]:
        write_text(kw["plan_json"], result.plan.to_json())
    save_model(result.model, output)
    if not kw["quiet"]:
        c = result.plan.counts()
        before, after = model.stat().st_size, output.stat().st_size
        click.echo(
            f"{model} -> {output}: {options.effective_level} {options.dtype}, "
            f"{c['low']} low / {c['fp32']} fp32 / {c['unchanged']} unchanged nodes, "
            f"casts {result.casts_before} -> {result.casts_after}, "
            f"{_mb(before)} -> {_mb(after)}, {sum(result.timings.values()):.2f} s"
        )


@cli.command("lists")
@click.option("--profile", type=click.Choice(PROFILES), default="default", show_default=True, help="List profile.")
@click.option("--level", type=click.Choice(LEVELS), default="O2", show_default=True, help="Level the lists apply to.")
@click.option("--dtype", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True, help="Low dtype.")
def lists_command(profile: str, level: str, dtype: str) -> None:
    """Print the white, black and follow lists in force, with reasons."""
    lists = ConvertOptions(level=level, dtype=dtype, lists=profile).validated().op_lists()
    click.echo(f"# profile {profile}, level {level}, dtype {dtype}")
    for title, table in (("white", lists.white), ("black", lists.black), ("follow", lists.follow)):
        click.echo(f"\n{title} ({len(table)}):")
        for op in sorted(table):
            click.echo(f"  {op:28s} {table[op]}")
    unlisted = "follow their inputs" if lists.unlisted_follow else ("fp32" if level == "O1" else "low")
    click.echo(f"\nunlisted ops: {unlisted} at {level}")


def _default_output(model: Path, dtype: str) -> Path:
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    return model.with_name(f"{stem}.{dtype}.onnx")


def _check_output_path(model: Path, output: Path) -> None:
    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise AmpError(f"{output}: output is the input file; choose another -o (the input is never overwritten)")
    if output.is_dir():
        raise AmpError(f"{output}: is a directory; give a file name with -o")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every failure into one line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="amp-convert", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("amp-convert: interrupted", err=True)
        return 130
    except click.UsageError as e:
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
    except Exception as e:  # a bug: still one line unless --debug
        return _fail(f"internal error: {type(e).__name__}: {e} (run with --debug for a traceback)", EXIT_INTERNAL, debug)
    return EXIT_OK


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    first = " ".join(message.split())
    click.echo(f"amp-convert: error: {first}", err=True)
    return code
