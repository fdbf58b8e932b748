"""Reports: a versioned JSON document for machines, a short table for the
terminal, and one self-contained HTML page (tables plus a picture of error
through the graph) for people."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from .plan import Precision
from .report_html import html_report
from .report_text import terminal_table
from .version import __version__

SCHEMA_ID = "amp-convert-report"
# 2: validation.reference_emulated and reference_emulation_note (a low-precision reference).
# 3: validation.pinned (choices the candidate took from the reference, pin.py).
# 4: warning_kinds beside each compared tensor's warnings (the same order).
# 5: sequence and optional outputs: kinds "sequence" (its elements follow as outputs named name[i], each
#    with element_of and index; past 16 elements one row of kind "elements" for them all, then the worst
#    failing ones) and "empty", and structure_mismatch, empty and lengths beside an output's metrics;
#    warnings, warning_kinds and checks always there (unreleased between 3 and 5: one version).
# 6: plan.coverage (the share of float compute that runs low, the causes of the rest, the warning);
#    validation.kernel_note.
# 7: values_over_limit(_at_least), top1_agreement and top1_rows beside an output's metrics; tolerance.min_top1.
# 8: error_stat beside a judged float output's metrics (the statistic of its absolute errors that is judged:
#    name, quantile, value, exact, bounds), and error_stat and quantile in every tolerance.
SCHEMA_VERSION = 8


def report_schema() -> dict:
    """The JSON Schema every report validates against."""
    text = resources.files("amp_convert").joinpath("report.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def report_json(report: dict) -> str:
    """The report as strict JSON, which has no NaN or Infinity: the report
    writes non-finite metrics as null or "inf" (the schema says which), and
    any that slipped through raises rather than make a file parsers refuse."""
    return json.dumps(report, indent=1, allow_nan=False)


def build_report(
    *,
    command: str,
    model_path: str | Path,
    model_nodes: int,
    output_path: str | Path | None,
    written: bool,
    options: dict | None,
    conversion=None,  # ConversionResult
    validation=None,  # ValidationResult
    inputs: dict | None = None,
    timings: dict[str, float] | None = None,
    size_before: int | None = None,
    size_after: int | None = None,
    exit_code: int = 0,
    auto: dict | None = None,
) -> dict[str, Any]:
    plan = None
    conv = None
    if conversion is not None:
        rules: dict[str, int] = {}
        low_ops: dict[str, int] = {}
        tally = conversion.plan.tally()
        for (precision, rule, op_type), n in tally.items():
            rules[rule] = rules.get(rule, 0) + n
            if precision is Precision.LOW:
                low_ops[op_type] = low_ops.get(op_type, 0) + n
        plan = {
            "level": conversion.plan.level,
            "dtype": conversion.plan.dtype,
            "profile": conversion.plan.profile,
            "counts": conversion.plan.counts(tally),
            "rules": dict(sorted(rules.items())),
            "low_ops": dict(sorted(low_ops.items())),
            "notes": conversion.plan.notes,
            "coverage": _coverage(conversion.coverage),
        }
        conv = {
            "casts_before": conversion.casts_before,
            "casts_after": conversion.casts_after,
            "rewrite": conversion.stats.as_dict(),
            "cleanup": conversion.cleanup,
        }
    status = "not-validated" if validation is None else ("passed" if validation.passed else "failed")
    ratio = size_after / size_before if size_before and size_after else None
    return {
        "schema": SCHEMA_ID,
        "version": SCHEMA_VERSION,
        "tool": {"name": "amp-convert", "version": __version__},
        "command": command,
        "model": {"path": str(model_path), "nodes": model_nodes, "size_bytes": size_before},
        "output": {"path": None if output_path is None else str(output_path), "written": written, "size_bytes": size_after},
        "options": options or {},
        "plan": plan,
        "conversion": conv,
        "inputs": inputs,
        "validation": None if validation is None else validation.as_dict(),
        "auto": auto,
        "timing_s": {k: round(v, 4) for k, v in (timings or {}).items()},
        "size": {"before_bytes": size_before, "after_bytes": size_after, "ratio": ratio},
        "result": {"status": status, "exit_code": exit_code},
    }


class Report:
    """The account of one run: ``data``, the JSON document (schema
    ``amp-convert-report``, see :func:`report_schema`), and its renderings."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    def of(cls, conversion=None, validation=None, *, model: str | Path = "<memory>", nodes: int | None = None) -> Report:
        """The report of results made in memory: a :class:`ConversionResult`,
        a :class:`ValidationResult`, or both (``validation`` None: the
        conversion's own, for ``level="auto"``). ``model``: what to call the
        input; ``nodes``: its node count (None: the converted model's plan's).
        Raises AmpError when given neither."""
        from .errors import UsageError

        validation = validation if validation is not None else getattr(conversion, "validation", None)
        if conversion is None and validation is None:
            raise UsageError("a report needs a conversion or a validation", "conversion")
        if conversion is not None:
            decided = conversion_fields(conversion.options, conversion, validation, getattr(conversion, "auto", None))
        else:
            decided = {"options": None, "timings": {"validate": validation.seconds}, "exit_code": int(not validation.passed)}
        data = build_report(
            command="convert" if conversion is not None else "compare",
            model_path=model,
            model_nodes=nodes if nodes is not None else _main_nodes(conversion),
            output_path=None,
            written=False,
            conversion=conversion,
            validation=validation,
            inputs=None if validation is None else validation.inputs,
            **decided,
        )
        return cls(data)

    @property
    def status(self) -> str:
        """passed, failed or not-validated."""
        return self.data["result"]["status"]

    @property
    def passed(self) -> bool:
        """Whether the model met the tolerance (True when not validated)."""
        return self.status != "failed"

    def to_json(self) -> str:
        """Strict JSON (no NaN or Infinity)."""
        return report_json(self.data)

    def to_html(self) -> str:
        """One self-contained HTML page."""
        return html_report(self.data)

    def to_text(self) -> str:
        """The terminal's table of outputs and offenders ("" when nothing was validated)."""
        return "" if self.data["validation"] is None else terminal_table(self.data)

    def save(self, path: str | Path) -> None:
        """Write the report atomically: HTML where ``path`` ends in .html or .htm, else JSON.
        Raises AmpError where ``path`` cannot be written as a file."""
        from .saving import TextFiles

        text = self.to_html() if Path(path).suffix.lower() in (".html", ".htm") else self.to_json()
        with TextFiles() as files:
            files.write(path, text)
            files.place()


def conversion_fields(options, conversion, validation=None, searched=None) -> dict[str, Any]:
    """The :func:`build_report` arguments a conversion's results decide:
    ``options`` (the ConvertOptions asked for; the level auto where
    ``searched``, the auto search), the timings, the exit code and the search."""
    timings = dict(conversion.timings)
    if validation is not None:
        timings["validate"] = validation.seconds
    return {
        "options": {**options.as_dict(), "level": "auto" if searched else options.effective_level},
        "timings": {"auto_search": searched.seconds} if searched is not None else timings,
        "exit_code": 0 if validation is None or validation.passed else 1,
        "auto": None if searched is None else searched.as_dict(),
    }


def _main_nodes(conversion) -> int:
    """The main graph's node count, as its plan has it (0 without a conversion)."""
    return 0 if conversion is None else sum(1 for _ in conversion.plan.entries.get("", ()))


def _coverage(covered) -> dict | None:
    """The plan's ``coverage`` object: see :meth:`amp_convert.coverage.Coverage.as_dict`, with its warning."""
    if covered is None:
        return None
    return {**covered.as_dict(), "summary": covered.summary(), "warning": covered.warning()}
