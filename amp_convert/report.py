"""Reports: a versioned JSON document for machines, a short table for the
terminal, and one self-contained HTML page (tables plus a picture of error
through the graph) for people."""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from .plan import Precision
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


# ------------------------------------------------------------------ terminal


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return f"{x:.4g}"
    return str(x)


def terminal_table(report: dict) -> str:
    """Per output: metric, value, tolerance, PASS/FAIL; then the top offenders."""
    v = report["validation"]
    if v is None:
        return "validation skipped"
    tol = v["tolerance"]
    rows = [("output", "metric", "value", "tolerance", "")]
    for out in v["outputs"]:
        rows += _metric_rows(out["name"], out, out.get("tolerance", tol))
    for out in v["pinned"]["inputs"]:  # the values a pinned choice reads: finite, same direction
        rows += _metric_rows(f"{out['name']} (choice input)", out, tol, judged_only=True)
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    lines = ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    differ = [f"mismatch: {out['name']}: {out['failures'][0]}" for out in v["outputs"] if _structure_differs(out)]
    failing = [f"failing: {o['name']}: {o['failures'][0]}" for o in v["outputs"] if o["kind"] == "elements" and o["failures"]]
    warned = [f"warning: {out['name']}: {w}" for out in v["outputs"] for w in out.get("warnings", [])]
    if differ or failing or warned:
        lines += ["", *differ, *failing, *warned]
    offenders = v["offenders"]  # (--top of them)
    if offenders:
        lines.append("")
        lines.append("error by node (relative RMS vs fp32: before -> after it; reaching the outputs), worst first:")
        for o in offenders:
            before, after, reaching = (_fmt(o[k]) for k in ("error_before", "error_after", "error_to_outputs"))
            lines.append(f"  {o['name']} ({o['op_type']}, {o['precision']}): {before} -> {after}; reaching {reaching}")
    pinned = pinned_summary(v["pinned"])
    if pinned:
        lines.append("")
        lines.append(pinned)
    how = "emulated " if v["emulated"] else ""
    verdict = "PASS" if v["passed"] else "FAIL"
    lines.append("")
    lines.append(f"{verdict}: {v['samples']} sample(s), {how}{v['dtype']} on {v['provider']} ({v['emulation_note']})")
    if v["reference_emulated"]:
        lines.append(f"the reference is low precision too: emulated ({v['reference_emulation_note']})")
    if v.get("kernel_note"):
        lines.append(f"note: {v['kernel_note']}")
    return "\n".join(lines)


def _metric_rows(label: str, out: dict, tol: dict, judged_only: bool = False) -> list[tuple[str, ...]]:
    """Table rows for one compared tensor; ``judged_only``: just the checks it is judged on."""
    checks = out["checks"]
    if _structure_differs(out):  # (its reason follows the table)
        return [(label, "structure", "differs", "as fp32's", "FAIL")]
    if "shape" in checks:
        return [(label, "shape", "differs", "equal", "FAIL")]
    if out["kind"] == "elements":  # (a long sequence's: the failing ones follow, the reason after the table)
        e = out["elements"]
        rows = [("elements passing", f"{e['passed']} of {e['count']}", "all", _pf(checks["elements"]))]
        rows.append(("worst element", e["worst"]["name"], "", ""))
        return [(label if k == 0 else "", *row) for k, row in enumerate(rows)]
    if out["kind"] in ("sequence", "empty"):
        return [(label, "length" if out["kind"] == "sequence" else "value", _held(out), "as fp32's", "PASS")]
    if out["kind"] == "exact":
        return [(label, "equal fraction", _fmt(out["equal_fraction"]), f">= {tol['min_equal']}", _pf(checks["equal_fraction"]))]
    rows = []
    if not judged_only:
        limit = f"<= {_fmt(out['limit_abs_err'])}"
        stat = out.get("error_stat") or {"name": "max"}
        if stat["name"] == "max":
            rows.append(("max abs error", _fmt(out["max_abs_err"]), limit, _pf(checks["max_abs_err"])))
        else:  # (the statistic judged first, the max beside it)
            rows.append((_stat_label(stat), _stat_value(stat), limit, _pf(checks[f"{stat['name']}_abs_err"])))
            rows.append(("max abs error", _fmt(out["max_abs_err"]), "", ""))
        if "values_over_limit" in out:
            over = f"{'at least ' if out['values_over_limit_at_least'] else ''}{out['values_over_limit']:,} of {out['values']:,}"
            rows.append(("over the limit", over, "", ""))
        if stat["name"] != "mean":
            rows.append(("mean abs error", _fmt(out["mean_abs_err"]), "", ""))
        rows.append(("max rel error", _fmt(out["max_rel_err"]), "", ""))
    rows.append(("cosine", f"{out['cosine']:.6f}", f">= {tol['min_cosine']}", _pf(checks["cosine"])))
    if out.get("top1_agreement") is not None and not judged_only:
        gate = "top1" in checks
        rows.append(
            (
                "top-1 agreement",
                f"{out['top1_agreement']:.4%} of {out['top1_rows']:,} rows",
                f">= {tol['min_top1']}" if gate else "",
                _pf(checks["top1"]) if gate else "",
            )
        )
    if not judged_only:
        rows.append(("SNR dB", _snr(out), "", ""))
    nonfinite = f"{out['cand_nan'] + out['cand_inf']} (fp32: {out['ref_nan'] + out['ref_inf']})"
    rows.append(("NaN/Inf", nonfinite, "as fp32's", _pf(checks["nonfinite"])))
    for kind in out.get("warning_kinds", []) if not judged_only else ():
        rows.append(_WARNING_ROWS[kind])
    return [(label if k == 0 else "", *row) for k, row in enumerate(rows)]


def _stat_label(stat: dict) -> str:
    """A judged statistic as the terminal names it: "median abs error", "p99.9 abs error"."""
    name = f"p{stat['quantile'] * 100:g}" if stat["name"] == "quantile" else stat["name"]
    return f"{name} abs error"


def _stat_value(stat: dict) -> str:
    """Its value; one only bounded (past the errors kept) shows its upper end, after "~"."""
    return _fmt(stat["value"]) if stat["exact"] else f"~{_fmt(stat['value'])}"


def _structure_differs(out: dict) -> bool:
    """Whether a compared output fails on its structure (a sequence's length, an optional's presence, a map's keys)."""
    return out["checks"].get("structure") is False


def _held(out: dict) -> str:
    """What a sequence output held (its lengths) or that an optional one was empty in both models."""
    lengths = out.get("lengths")
    if lengths is None:
        return "empty in both"
    low, high = lengths
    return f"{low} element(s)" if low == high else f"{low}-{high} elements"


# The terminal table's row for each kind of warning (its text follows the table).
_WARNING_ROWS = {
    "all_zeros": ("all zeros", "yes", "within --atol", "WARN"),
    "mixed_scales": ("mixed scales", "part off", "see below", "WARN"),
}


def clipping_summary(report: dict) -> str:
    """One sentence on the constant values the conversion clipped or flushed
    to zero (the JSON counts them per constant; empty when none)."""
    rewrite = (report.get("conversion") or {}).get("rewrite") or {}
    if not (rewrite.get("clipped") or rewrite.get("flushed")):
        return ""
    dtype = report["plan"]["dtype"]
    bits = []
    for key, what in (("clipped", f"clipped to {dtype}'s largest value"), ("flushed", "flushed to zero")):
        if rewrite[key]:
            names = sorted(rewrite[key])
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            bits.append(f"{sum(rewrite[key].values())} value(s) {what} (in {shown})")
    return f"constants changed to fit {dtype}: {'; '.join(bits)}"


def pinned_summary(pinned: dict) -> str:
    """One sentence on the choices the candidate took from the reference."""
    if pinned["note"]:
        return pinned["note"]
    selections = pinned["selections"]
    if not selections:
        return ""
    ops: dict[str, int] = {}
    for p in selections:
        ops[p["op_type"]] = ops.get(p["op_type"], 0) + 1
    kinds = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
    agreements = [p["agreement"] for p in selections if p["agreement"] is not None]
    own = f"its own agree on {min(agreements):.0%} or more of the chosen elements" if agreements else "its own"
    moved = sum(1 for p in selections if p["shape_mismatch"])
    if moved:
        own += f"; {moved} chose a different number of elements in some sample"
    return (
        f"{len(selections)} choice(s) pinned to the fp32 model's ({kinds}), so outputs compare values, "
        f"not tie-breaks; {own} (--no-pin-choices compares as is)"
    )


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d1d1f;max-width:1100px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#555;font-size:13px} .meta.warn{color:#9a6700;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;font-weight:600;color:#fff}
.pass{background:#1a7f37}.fail{background:#cf222e}.skip{background:#6e7781}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
td.bad{color:#cf222e;font-weight:600} td.good{color:#1a7f37}
.legend span{display:inline-block;margin-right:16px;font-size:12px}
.dot{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px;vertical-align:middle}
"""

_COLORS = {"low": "#e8710a", "fp32": "#1f6feb", "unchanged": "#8c959f"}


def html_report(report: dict) -> str:
    """One self-contained page: no external files, scripts or fonts."""
    v = report["validation"]
    status = report["result"]["status"]
    badge = {"passed": "pass", "failed": "fail"}.get(status, "skip")
    plan = report.get("plan") or {}
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>amp-convert report: {html.escape(Path(report['model']['path']).name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(Path(report['model']['path']).name)} <span class='badge {badge}' id='status'>{status}</span></h1>",
        f"<div class='meta'>{html.escape(_summary_line(report))}</div>",
    ]
    if plan:
        counts = plan["counts"]
        parts.append("<h2>Plan</h2><table><tr><th>low</th><th>fp32</th><th>unchanged</th><th>notes</th></tr>")
        notes = "; ".join(plan["notes"]) or "-"
        parts.append(
            f"<tr><td class='num'>{counts['low']}</td><td class='num'>{counts['fp32']}</td>"
            f"<td class='num'>{counts['unchanged']}</td><td>{html.escape(notes)}</td></tr></table>"
        )
        covered = plan.get("coverage")
        if covered:
            parts.append(f"<div class='meta' id='coverage'>{html.escape(covered['summary'])}</div>")
            if covered["warning"]:
                parts.append(f"<div class='meta warn' id='coverage-warning'>{html.escape(covered['warning'])}</div>")
        rules = "".join(f"<tr><td>{html.escape(k)}</td><td class='num'>{n}</td></tr>" for k, n in sorted(plan["rules"].items()))
        parts.append(f"<table><tr><th>rule</th><th>nodes</th></tr>{rules}</table>")
        clipping = clipping_summary(report)
        if clipping:
            parts.append(f"<div class='meta' id='clipping'>{html.escape(clipping)}</div>")
    if v is not None:
        parts.append("<h2>Outputs</h2>")
        if v.get("kernel_note"):
            parts.append(f"<div class='meta' id='kernel-note'>{html.escape(v['kernel_note'])}</div>")
        parts.append(_outputs_table(v))
        parts.append("<h2>Error through the graph</h2>")
        parts.append(
            "<div class='meta'>Relative RMS error of each node's output against fp32, in topological order "
            "(log scale; a cross marks NaN/Inf).</div>"
        )
        parts.append(error_chart_svg(v["nodes"], v["offenders"]))
        parts.append("<div class='legend'>")
        for k, c in _COLORS.items():
            parts.append(f"<span><i class='dot' style='background:{c}'></i>{k}</span>")
        parts.append("</div>")
        parts.append("<h2>Top offenders</h2>")
        parts.append(_offenders_table(v["offenders"]))
        if v["pinned"]["selections"] or v["pinned"]["note"]:
            parts.append("<h2>Pinned choices</h2>")
            parts.append(f"<div class='meta'>{html.escape(pinned_summary(v['pinned']))}</div>")
            parts.append(_pinned_table(v["pinned"]))
    parts.append("</body></html>")
    return "\n".join(parts)


def _coverage(covered) -> dict | None:
    """The plan's ``coverage`` object: see :meth:`amp_convert.coverage.Coverage.as_dict`, with its warning."""
    if covered is None:
        return None
    return {**covered.as_dict(), "summary": covered.summary(), "warning": covered.warning()}


def _summary_line(report: dict) -> str:
    bits = [f"command {report['command']}"]
    plan = report.get("plan")
    if plan:
        bits.append(f"level {plan['level']}, {plan['dtype']}, lists {plan['profile']}")
    v = report.get("validation")
    if v:
        bits.append(f"{'emulated ' if v['emulated'] else ''}{v['dtype']} on {v['provider']}, {v['samples']} samples")
        if v["reference_emulated"]:
            bits.append("reference emulated")
    size = report["size"]
    if size["before_bytes"] and size["after_bytes"]:
        bits.append(f"size {size['before_bytes'] / 1e6:.2f} MB -> {size['after_bytes'] / 1e6:.2f} MB")
    bits.append(f"amp-convert {report['tool']['version']}")
    return " | ".join(bits)


def _outputs_table(v: dict) -> str:
    # A column for the statistic judged where some output is judged by another than its max.
    stats = any((o.get("error_stat") or {"name": "max"})["name"] != "max" for o in v["outputs"])
    head = "<table id='outputs'><tr><th>output</th><th>max abs err</th>"
    head += "<th>judged error</th>" if stats else ""
    head += "<th>limit</th><th>mean abs err</th>"
    head += "<th>max rel err</th><th>over the limit</th><th>cosine</th><th>top-1 agreement</th><th>SNR dB</th>"
    head += "<th>NaN/Inf (fp32)</th><th>result</th></tr>"
    judged = [(o["name"], o, False) for o in v["outputs"]]
    # the values a pinned choice reads are judged too (as the terminal table shows)
    judged += [(f"{o['name']} (choice input)", o, True) for o in v["pinned"]["inputs"]]
    rows = [head, *(_output_row(*row, stats=stats) for row in judged), "</table>"]
    failures = [
        f"<li>{html.escape(label)}: {html.escape('; '.join(o['failures']))}</li>" for label, o, _ in judged if o["failures"]
    ]
    if failures:
        rows.append(f"<ul id='failures' class='meta'>{''.join(failures)}</ul>")
    warned = [
        f"<li data-kind='{kind}'>{html.escape(o['name'])}: {html.escape(w)}</li>"
        for o in v["outputs"]
        for w, kind in zip(o.get("warnings", []), o.get("warning_kinds", []), strict=True)
    ]
    if warned:
        rows.append(f"<ul id='warnings' class='meta'>{''.join(warned)}</ul>")
    return "".join(rows)


def _output_row(label: str, o: dict, judged_only: bool = False, stats: bool = False) -> str:
    """One compared tensor; ``judged_only``: only the metrics it is judged on (finite, cosine);
    ``stats``: with a cell for the statistic of its errors that is judged."""
    ok = o["passed"]
    verdict = f"<td class='{'good' if ok else 'bad'}' title='{html.escape('; '.join(o['failures']))}'>{_pf(ok)}</td>"
    if o["kind"] != "float" or o.get("shape_mismatch") or _structure_differs(o):
        if _structure_differs(o):
            detail = "structure differs"
        elif o.get("shape_mismatch"):
            detail = "shape differs"
        elif o["kind"] == "exact":
            detail = f"equal fraction {o.get('equal_fraction', 0):.4f}"
        elif o["kind"] == "elements":
            e = o["elements"]
            detail = f"{e['passed']} of {e['count']} elements pass; the worst {e['worst']['name']}: {e['worst']['detail']}"
        else:
            detail = f"sequence: {_held(o)}" if o["kind"] == "sequence" else "empty in both"
        return f"<tr><td>{html.escape(label)}</td><td colspan='{10 if stats else 9}'>{html.escape(detail)}</td>{verdict}</tr>"
    shown = ("max_abs_err", "limit_abs_err", "mean_abs_err", "max_rel_err")
    cells = "".join(f"<td class='num'>{'-' if judged_only else _fmt(o[k])}</td>" for k in shown)
    if stats:
        stat = o.get("error_stat")
        judged = "-" if judged_only or stat is None else f"{_stat_label(stat).removesuffix(' abs error')} {_stat_value(stat)}"
        first = cells.index("</td>") + len("</td>")  # (after the max abs error)
        cells = f"{cells[:first]}<td class='num'>{html.escape(judged)}</td>{cells[first:]}"
    over = "-" if judged_only or "values_over_limit" not in o else f"{o['values_over_limit']:,} of {o['values']:,}"
    top1 = "-" if judged_only or o.get("top1_agreement") is None else f"{o['top1_agreement']:.4%}"
    nonfinite = f"{o['cand_nan'] + o['cand_inf']} ({o['ref_nan'] + o['ref_inf']})"
    return (
        f"<tr><td>{html.escape(label)}</td>{cells}<td class='num'>{over}</td><td class='num'>{o['cosine']:.6f}</td>"
        f"<td class='num'>{top1}</td><td class='num'>{'-' if judged_only else _snr(o)}</td>"
        f"<td class='num'>{nonfinite}</td>{verdict}</tr>"
    )


def _pinned_table(pinned: dict) -> str:
    rows = ["<table id='pinned'><tr><th>choice</th><th>node</th><th>op</th><th>own choice agrees</th>"]
    rows.append("<th>samples choosing another count</th></tr>")
    for p in pinned["selections"]:
        agree = "-" if p["agreement"] is None else f"{p['agreement']:.1%}"
        rows.append(
            f"<tr><td>{html.escape(p['name'])}</td><td>{html.escape(p['node'])}</td><td>{html.escape(p['op_type'])}</td>"
            f"<td class='num'>{agree}</td><td class='num'>{p['shape_mismatch']}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _offenders_table(offenders: list[dict]) -> str:
    if not offenders:
        return "<p class='meta'>No node adds measurable error.</p>"
    rows = [
        "<table id='offenders'><tr><th>#</th><th>node</th><th>op</th><th>precision</th><th>error before</th><th>after</th>"
        "<th>reaching the outputs</th></tr>"
    ]
    for rank, o in enumerate(offenders, 1):
        rows.append(
            f"<tr><td>{rank}</td><td>{html.escape(o['name'])}</td><td>{html.escape(o['op_type'])}</td>"
            f"<td>{o['precision']}</td><td class='num'>{_fmt(o['error_before'])}</td>"
            f"<td class='num'>{_fmt(o['error_after'])}</td><td class='num'>{_fmt(o['error_to_outputs'])}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def error_chart_svg(nodes: list[dict], offenders: list[dict], width: int = 1000, height: int = 320) -> str:
    """Error per node in topological order, as inline SVG (log scale)."""
    left, right, top, bottom = 56, 16, 16, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    lo_exp, hi_exp = -8, 1
    out = [
        f"<svg id='error-chart' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='error per node'>",
        f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='#fafbfc' stroke='#d0d7de'/>",
    ]
    for e in range(lo_exp, hi_exp + 1):
        y = top + plot_h * (hi_exp - e) / (hi_exp - lo_exp)
        out.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eaeef2'/>")
        out.append(f"<text x='{left - 6}' y='{y + 4:.1f}' font-size='11' text-anchor='end' fill='#57606a'>1e{e}</text>")
    out.append(
        f"<text x='{left + plot_w / 2}' y='{height - 6}' font-size='12' text-anchor='middle' fill='#57606a'>"
        "nodes in topological order</text>"
    )
    if nodes:
        n = len(nodes)
        # One mark per pixel column at most: keep the worst node of each column.
        columns: dict[int, dict] = {}
        for pos, node in enumerate(nodes):
            col = int(pos * plot_w / max(n, 1))
            err = _as_float(node["error_after"])
            if col not in columns or err > _as_float(columns[col]["error_after"]):
                columns[col] = {**node, "_pos": pos}
        for col in sorted(columns):
            node = columns[col]
            x = left + (node["_pos"] + 0.5) * plot_w / n
            err = _as_float(node["error_after"])
            color = _COLORS.get(node["precision"], "#8c959f")
            title = html.escape(f"{node['name']} ({node['op_type']}, {node['precision']}): {_fmt(err)}")
            if math.isinf(err):
                y = top + 6
                out.append(
                    f"<path d='M{x - 4:.1f},{y - 4} L{x + 4:.1f},{y + 4} M{x - 4:.1f},{y + 4} L{x + 4:.1f},{y - 4}' "
                    f"stroke='#cf222e' stroke-width='2'><title>{title}</title></path>"
                )
                continue
            y = _y(err, lo_exp, hi_exp, top, plot_h)
            out.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.6' fill='{color}'><title>{title}</title></circle>")
        positions = {node["index"]: pos for pos, node in enumerate(nodes)}
        for o in offenders[:3]:
            if o["index"] not in positions:
                continue
            x = left + (positions[o["index"]] + 0.5) * plot_w / n
            err = _as_float(o["error_after"])
            y = top + 14 if math.isinf(err) else _y(err, lo_exp, hi_exp, top, plot_h) - 8
            label = html.escape(o["name"][-40:])
            anchor = "end" if x > left + plot_w * 0.7 else "start"
            out.append(
                f"<text x='{x:.1f}' y='{max(y, top + 12):.1f}' font-size='11' text-anchor='{anchor}' "
                f"fill='#24292f'>{label}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _as_float(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)


def _y(err: float, lo_exp: int, hi_exp: int, top: int, plot_h: int) -> float:
    e = math.log10(err) if err > 0 else lo_exp
    e = min(max(e, lo_exp), hi_exp)
    return top + plot_h * (hi_exp - e) / (hi_exp - lo_exp)


def _snr(output: dict) -> str:
    """An output's SNR as shown: JSON holds an infinite one as null, +inf where
    the outputs are equal, -inf where the reference is all zeros and the
    candidate is not."""
    if output["snr_db"] is not None:
        return _fmt(output["snr_db"])
    return "inf" if output["max_abs_err"] == 0 else "-inf"
