"""The terminal's report: per output its metrics, tolerance and verdict,
the top offenders, and the one-sentence summaries printed beside it."""

from __future__ import annotations

from .report_cells import fmt, held, pass_fail, snr, stat_label, stat_value, structure_differs


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
    differ = [f"mismatch: {out['name']}: {out['failures'][0]}" for out in v["outputs"] if structure_differs(out)]
    failing = [f"failing: {o['name']}: {o['failures'][0]}" for o in v["outputs"] if o["kind"] == "elements" and o["failures"]]
    warned = [f"warning: {out['name']}: {w}" for out in v["outputs"] for w in out.get("warnings", [])]
    if differ or failing or warned:
        lines += ["", *differ, *failing, *warned]
    offenders = v["offenders"]  # (--top of them)
    if offenders:
        lines.append("")
        lines.append("error by node (relative RMS vs fp32: before -> after it; reaching the outputs), worst first:")
        for o in offenders:
            before, after, reaching = (fmt(o[k]) for k in ("error_before", "error_after", "error_to_outputs"))
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
    if v.get("branch_note"):
        lines.append(f"note: {v['branch_note']}")
    return "\n".join(lines)


def _metric_rows(label: str, out: dict, tol: dict, judged_only: bool = False) -> list[tuple[str, ...]]:
    """Table rows for one compared tensor; ``judged_only``: just the checks it is judged on."""
    checks = out["checks"]
    if structure_differs(out):  # (its reason follows the table)
        return [(label, "structure", "differs", "as fp32's", "FAIL")]
    if "shape" in checks:
        return [(label, "shape", "differs", "equal", "FAIL")]
    if out["kind"] == "elements":  # (a long sequence's: the failing ones follow, the reason after the table)
        e = out["elements"]
        rows = [("elements passing", f"{e['passed']} of {e['count']}", "all", pass_fail(checks["elements"]))]
        rows.append(("worst element", e["worst"]["name"], "", ""))
        return [(label if k == 0 else "", *row) for k, row in enumerate(rows)]
    if out["kind"] in ("sequence", "empty"):
        return [(label, "length" if out["kind"] == "sequence" else "value", held(out), "as fp32's", "PASS")]
    if out["kind"] == "exact":
        return [
            (label, "equal fraction", fmt(out["equal_fraction"]), f">= {tol['min_equal']}", pass_fail(checks["equal_fraction"]))
        ]
    rows = []
    if not judged_only:
        limit = f"<= {fmt(out['limit_abs_err'])}"
        stat = out.get("error_stat") or {"name": "max"}
        if stat["name"] == "max":
            rows.append(("max abs error", fmt(out["max_abs_err"]), limit, pass_fail(checks["max_abs_err"])))
        else:  # (the statistic judged first, the max beside it)
            rows.append((stat_label(stat), stat_value(stat), limit, pass_fail(checks[f"{stat['name']}_abs_err"])))
            rows.append(("max abs error", fmt(out["max_abs_err"]), "", ""))
        if "values_over_limit" in out:
            over = f"{'at least ' if out['values_over_limit_at_least'] else ''}{out['values_over_limit']:,} of {out['values']:,}"
            rows.append(("over the limit", over, "", ""))
        if stat["name"] != "mean":
            rows.append(("mean abs error", fmt(out["mean_abs_err"]), "", ""))
        rows.append(("max rel error", fmt(out["max_rel_err"]), "", ""))
    rows.append(("cosine", f"{out['cosine']:.6f}", f">= {tol['min_cosine']}", pass_fail(checks["cosine"])))
    if out.get("top1_agreement") is not None and not judged_only:
        gate = "top1" in checks
        rows.append(
            (
                "top-1 agreement",
                f"{out['top1_agreement']:.4%} of {out['top1_rows']:,} rows",
                f">= {tol['min_top1']}" if gate else "",
                pass_fail(checks["top1"]) if gate else "",
            )
        )
    if not judged_only:
        rows.append(("SNR dB", snr(out), "", ""))
    nonfinite = f"{out['cand_nan'] + out['cand_inf']} (fp32: {out['ref_nan'] + out['ref_inf']})"
    rows.append(("NaN/Inf", nonfinite, "as fp32's", pass_fail(checks["nonfinite"])))
    for kind in out.get("warning_kinds", []) if not judged_only else ():
        rows.append(_WARNING_ROWS[kind])
    return [(label if k == 0 else "", *row) for k, row in enumerate(rows)]


# The terminal table's row for each kind of warning (its text follows the table).
_WARNING_ROWS = {
    "all_zeros": ("all zeros", "yes", "within `atol`", "WARN"),
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
        f"not tie-breaks; {own} (`pin_choices` false compares as is)"
    )
