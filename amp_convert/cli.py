"""Command line: ``amp-convert MODEL --level O2 -o OUT`` and friends.

Each command parses its option groups (cli_options.py) into the library's
options, makes one library call, prints the result (cli_output.py) and
maps it to an exit code. Every user error is one line on stderr and exit
code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from .cli_options import (
    config_option,
    conversion_options,
    convert_only_options,
    output_option,
    to_convert_options,
    to_validation_options,
    validation_options,
)
from .cli_output import echo, echo_lists, echo_reports, echo_summary, hooks, stage_line
from .cli_params import spelled_as_flags
from .errors import AmpError, ConversionError
from .lists import LEVELS, PROFILES
from .options import ConvertOptions
from .version import __version__

EXIT_OK, EXIT_TOLERANCE, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # (click 8.2 on; 8.1 prints the help itself)


class DefaultCommandGroup(click.Group):
    """A group whose first argument is a model path unless it names a
    subcommand: ``amp-convert model.onnx ...`` means ``amp-convert convert model.onnx ...``."""

    default_command = "convert"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


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
@output_option
@conversion_options
@convert_only_options
@validation_options
@config_option
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
    with stage_line(kw) as on_stage:
        run = convert_file(
            model,
            to_convert_options(kw),
            validation=to_validation_options(kw),
            validate=kw["validate"],
            auto=AutoOptions(kw["max_trials"], kw["auto_from"]) if auto else None,
            outputs=outputs,
            check=kw["check"],
            hooks=hooks(kw, on_stage),
        )
    talk = not kw["quiet"] and not kw["json_out"]
    if run.auto is not None and not run.passed and talk:
        failing = run.auto.failures()
        echo(
            f"auto: no low-precision assignment met the tolerance in {run.auto.tried}; the closest, "
            f"trial {run.auto.chosen}, fails {'on ' + failing if failing else 'as shown'} (--write-on-fail writes it)"
        )
    if kw["explain"] and not kw["json_out"]:
        echo(run.conversion.plan.format_table())
    echo_reports(run.report, kw)
    if talk:
        echo_summary(run, model)
    if not run.passed:
        raise click.exceptions.Exit(EXIT_TOLERANCE)


@cli.command("compare")
@click.argument("reference", type=click.Path(dir_okay=True, path_type=Path))
@click.argument("candidate", type=click.Path(dir_okay=True, path_type=Path))
@validation_options
def compare_command(reference: Path, candidate: Path, **kw: Any) -> None:
    """Compare CANDIDATE (e.g. converted by another tool) with REFERENCE."""
    from .options import OutputOptions
    from .workflow import compare_files

    outputs = OutputOptions(report=kw["report"], html=kw["html"])
    run = compare_files(reference, candidate, to_validation_options(kw), outputs=outputs, hooks=hooks(kw))
    echo_reports(run.report, kw)
    if not run.passed:
        raise click.exceptions.Exit(EXIT_TOLERANCE)


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
    echo_lists(profile, level, dtype, ConvertOptions(level=level, dtype=dtype, lists=profile).validated().op_lists())


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
        return _fail(spelled_as_flags(str(e), _invoked(args)), EXIT_USAGE, debug)
    except ConversionError as e:
        return _fail(spelled_as_flags(str(e), _invoked(args)), EXIT_INTERNAL, debug)
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
