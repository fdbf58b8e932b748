"""What the commands print: the run's stage line, progress and trials as it
goes, the reports, the summary line, and the lists in force."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from .cli_params import spelled_as_flags
from .lists import ORT_QUANTIZED_OPS, OpLists


def echo(text: str, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` with the library's backquoted fields (`` `keep_fp32` ``)
    spelled as the running command's flags (--keep-fp32): every library text
    the commands print (notes, reasons, report lines, warnings) goes through here."""
    context = click.get_current_context(silent=True)
    click.echo(spelled_as_flags(text, context.command if context else None), err=err, nl=nl)


def echo_summary(run, model: Path) -> None:
    """What the conversion did, after the report: clipping, hints, the coverage warning, one summary line."""
    from .report_text import clipping_summary

    report, result = run.report.data, run.conversion
    clipping = clipping_summary(report)
    if clipping:
        echo(clipping)
    for hint in result.plan.hints:
        echo(f"hint: {hint}")
    covered = report["plan"]["coverage"]
    if covered["warning"]:
        echo(covered["warning"], err=True)
    c, size = report["plan"]["counts"], report["size"]
    searched = run.auto
    level = f"auto ({searched.tried}, {searched.low_compute:.1%} of compute low)" if searched else result.plan.level
    share = "" if searched else f" ({covered['summary']})"
    written = run.output if run.written else "(not written: out of tolerance; --write-on-fail writes it)"
    echo(
        f"{model} -> {written}: {level} {result.plan.dtype}, "
        f"{c['low']} low / {c['fp32']} fp32 / {c['unchanged']} unchanged nodes{share}, "
        f"casts {result.casts_before} -> {result.casts_after}, "
        f"{mb(size['before_bytes'])} -> {mb(size['after_bytes'])}, {sum(report['timing_s'].values()):.2f} s"
    )


def hooks(kw: dict, on_stage: Callable[[str], None] | None = None):
    """What the terminal shows as a run goes: the generated-inputs line, the
    stage line, auto's trials and the validation progress bar (none of it
    under --quiet or --json; the line and the bar only on a terminal)."""
    from .workflow import Hooks

    if kw["quiet"] or kw["json_out"]:
        return Hooks()

    def trial(t) -> None:
        verdict = "pass" if t.passed else "fail"
        echo(f"trial {t.number}: {t.step}: {verdict}, {t.low_compute:.1%} of compute low", err=True)

    @contextlib.contextmanager
    def validating(count: int | None) -> Iterator[Callable[[int], None]]:
        click.echo("\r\033[K", err=True, nl=False)  # (the stage line goes)
        with click.progressbar(length=count or 1, label="validating", file=sys.stderr) as bar:
            yield bar.update

    return Hooks(inputs=echo, stage=on_stage, trial=trial, validating=validating if sys.stderr.isatty() else None)


@contextlib.contextmanager
def stage_line(kw: dict):
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


def echo_reports(report, kw: dict) -> None:
    """The report as JSON (library output: its fields stay as named) under --json, else its terminal table."""
    if kw["json_out"]:
        click.echo(report.to_json())
    elif not kw["quiet"] and report.data["validation"] is not None:
        echo(report.to_text())


def mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def echo_lists(profile: str, level: str, dtype: str, lists: OpLists) -> None:
    """The white, black and follow lists in force at ``level``, with reasons (``amp-convert lists``)."""
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
            echo(f"  {op:{width}s} {table[op]}")
    unlisted = "follow their inputs" if lists.unlisted_follow else ("fp32" if level == "O1" else "low")
    click.echo(f"\nunlisted ops: {unlisted} at {level}")
