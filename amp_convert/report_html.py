"""The HTML report: one self-contained page (tables, and a picture of the
error through the graph) with no external files, scripts or fonts."""

from __future__ import annotations

import html
import math
from pathlib import Path

from .report_cells import fmt, held, pass_fail, snr, stat_label, stat_value, structure_differs
from .report_text import clipping_summary, pinned_summary

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
        if v.get("branch_note"):
            parts.append(f"<div class='meta warn' id='branch-note'>{html.escape(v['branch_note'])}</div>")
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
    verdict = f"<td class='{'good' if ok else 'bad'}' title='{html.escape('; '.join(o['failures']))}'>{pass_fail(ok)}</td>"
    if o["kind"] != "float" or o.get("shape_mismatch") or structure_differs(o):
        if structure_differs(o):
            detail = "structure differs"
        elif o.get("shape_mismatch"):
            detail = "shape differs"
        elif o["kind"] == "exact":
            detail = f"equal fraction {o.get('equal_fraction', 0):.4f}"
        elif o["kind"] == "elements":
            e = o["elements"]
            detail = f"{e['passed']} of {e['count']} elements pass; the worst {e['worst']['name']}: {e['worst']['detail']}"
        else:
            detail = f"sequence: {held(o)}" if o["kind"] == "sequence" else "empty in both"
        return f"<tr><td>{html.escape(label)}</td><td colspan='{10 if stats else 9}'>{html.escape(detail)}</td>{verdict}</tr>"
    shown = ("max_abs_err", "limit_abs_err", "mean_abs_err", "max_rel_err")
    cells = "".join(f"<td class='num'>{'-' if judged_only else fmt(o[k])}</td>" for k in shown)
    if stats:
        stat = o.get("error_stat")
        judged = "-" if judged_only or stat is None else f"{stat_label(stat).removesuffix(' abs error')} {stat_value(stat)}"
        first = cells.index("</td>") + len("</td>")  # (after the max abs error)
        cells = f"{cells[:first]}<td class='num'>{html.escape(judged)}</td>{cells[first:]}"
    over = "-" if judged_only or "values_over_limit" not in o else f"{o['values_over_limit']:,} of {o['values']:,}"
    top1 = "-" if judged_only or o.get("top1_agreement") is None else f"{o['top1_agreement']:.4%}"
    nonfinite = f"{o['cand_nan'] + o['cand_inf']} ({o['ref_nan'] + o['ref_inf']})"
    return (
        f"<tr><td>{html.escape(label)}</td>{cells}<td class='num'>{over}</td><td class='num'>{o['cosine']:.6f}</td>"
        f"<td class='num'>{top1}</td><td class='num'>{'-' if judged_only else snr(o)}</td>"
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
            f"<td>{o['precision']}</td><td class='num'>{fmt(o['error_before'])}</td>"
            f"<td class='num'>{fmt(o['error_after'])}</td><td class='num'>{fmt(o['error_to_outputs'])}</td></tr>"
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
            title = html.escape(f"{node['name']} ({node['op_type']}, {node['precision']}): {fmt(err)}")
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
