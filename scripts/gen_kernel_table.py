"""Build amp_convert/data/ort_kernels.json from onnxruntime's published kernel table.

The table is ``docs/OperatorKernels.md`` in the microsoft/onnxruntime
repository, generated there from the registered kernels. This script keeps
the CPUExecutionProvider and CUDAExecutionProvider sections, for the domains
ai.onnx (the default domain), ai.onnx.ml and com.microsoft, and writes per
provider, per domain, per op the kernels' version ranges and type
constraints:

    {"since": 13, "until": null, "types": {"T": ["tensor(bfloat16)", ...]}}

``until`` is null for an open range ("13+"), else the last opset of the range
("[6, 12]" gives 12, "13" gives 13).

Usage:
    python scripts/gen_kernel_table.py /tmp/OperatorKernels.md \\
        --commit 001d12d2623fd411ce0f83d05abb5e82304a3389 --release 1.25
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")
DOMAINS = ("ai.onnx", "ai.onnx.ml", "com.microsoft")
OUTPUT = Path(__file__).resolve().parent.parent / "amp_convert" / "data" / "ort_kernels.json"

# The md the shipped snapshot was made from (read through the search tool's read_file), and the release it was taken
# to describe: the commit's md lists opset-25 kernels, which no earlier release registers.
DEFAULT_COMMIT = "001d12d2623fd411ce0f83d05abb5e82304a3389"
DEFAULT_RELEASE = "1.25"

_SECTION = re.compile(r"^## Operators implemented by (\w+)\s*$")
_DOMAIN = re.compile(r"^\|\*\*Operator Domain:\*\* \*([\w.]+)\*\|")
_CONSTRAINT = re.compile(r"^\*\*(.+?)\*\* = (.*)$")


def parse_version(text: str) -> tuple[int, int | None]:
    """'13+' -> (13, None); '[6, 12]' -> (6, 12); '9' -> (9, 9). ValueError otherwise."""
    text = text.strip()
    if m := re.fullmatch(r"(\d+)\+", text):
        return int(m[1]), None
    if m := re.fullmatch(r"\[(\d+),\s*(\d+)\]", text):
        return int(m[1]), int(m[2])
    if m := re.fullmatch(r"\d+", text):
        return int(text), int(text)
    raise ValueError(f"unreadable opset version {text!r}")


def _split_types(text: str) -> list[str]:
    """Split 'tensor(a), map(int64,tensor(b))' on the commas outside parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def parse_types(text: str) -> dict[str, list[str]]:
    """'**T** = tensor(float)<br/> **T1** = tensor(bool)' -> {'T': [...], 'T1': [...]}. ValueError if unreadable."""
    types: dict[str, list[str]] = {}
    for part in text.split("<br/>"):
        part = part.strip()
        if not part:
            continue
        m = _CONSTRAINT.match(part)
        if not m:
            raise ValueError(f"unreadable type constraint {part!r}")
        types[m[1]] = sorted(_split_types(m[2]))
    return types


def parse_markdown(text: str) -> dict[str, dict[str, dict[str, list[dict]]]]:
    """The kernel table as {provider: {domain: {op: [kernel, ...]}}}, for PROVIDERS and DOMAINS only.

    Kernels keep the table's order (newest range first). Raises ValueError on a
    row of a kept section that does not parse, naming its line number.
    """
    table: dict[str, dict[str, dict[str, list[dict]]]] = {}
    provider = domain = op = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := _SECTION.match(line):
            provider, domain, op = m[1], None, None
            continue
        if provider not in PROVIDERS:
            continue
        if m := _DOMAIN.match(line):
            domain, op = m[1], None
            continue
        if domain not in DOMAINS or not line.startswith("|"):
            continue
        cells = line.split("|")
        if len(cells) != 6:  # the '| |' spacers between domains
            continue
        name, version, types = cells[1].strip(), cells[3], cells[4]
        if name:
            op = name
        if op is None:
            raise ValueError(f"line {number}: a continuation row before any op")
        try:
            since, until = parse_version(version)
            constraints = parse_types(types)
        except ValueError as e:
            raise ValueError(f"line {number}: {e}") from None
        ops = table.setdefault(provider, {}).setdefault(domain, {})
        ops.setdefault(op, []).append({"since": since, "until": until, "types": constraints})
    return table


def build(md_path: Path, commit: str, release: str) -> dict:
    """The snapshot document for the markdown at ``md_path``."""
    raw = md_path.read_bytes()
    table = parse_markdown(raw.decode("utf-8"))
    missing = [p for p in PROVIDERS if p not in table]
    if missing:
        raise ValueError(f"{md_path}: no section for {', '.join(missing)}")
    return {
        "source": {
            "repository": "microsoft/onnxruntime",
            "path": "docs/OperatorKernels.md",
            "commit": commit,
            "sha256": hashlib.sha256(raw).hexdigest(),
        },
        "onnxruntime_release": release,
        "providers": {p: {d: dict(sorted(ops.items())) for d, ops in sorted(table[p].items())} for p in PROVIDERS},
    }


def dump(doc: dict) -> str:
    """The document as JSON with one op per line: compact, and a new release's changes diff line by line."""
    lines = [
        "{",
        f' "source": {json.dumps(doc["source"])},',
        f' "onnxruntime_release": {json.dumps(doc["onnxruntime_release"])},',
    ]
    lines.append(' "providers": {')
    providers = list(doc["providers"].items())
    for i, (provider, domains) in enumerate(providers):
        lines.append(f"  {json.dumps(provider)}: {{")
        for j, (domain, ops) in enumerate(domains.items()):
            lines.append(f"   {json.dumps(domain)}: {{")
            rows = [f"    {json.dumps(op)}: {json.dumps(kernels, separators=(',', ':'))}" for op, kernels in ops.items()]
            lines.append(",\n".join(rows))
            lines.append("   }" + ("," if j < len(domains) - 1 else ""))
        lines.append("  }" + ("," if i < len(providers) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("markdown", type=Path, help="a copy of docs/OperatorKernels.md")
    parser.add_argument("--commit", default=DEFAULT_COMMIT, help="the onnxruntime commit the copy is from")
    parser.add_argument("--release", default=DEFAULT_RELEASE, help="the onnxruntime release the table describes")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        doc = build(args.markdown, args.commit, args.release)
    except (OSError, ValueError) as e:
        print(f"gen_kernel_table: {e}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(dump(doc))
    counts = ", ".join(f"{p}: {sum(len(ops) for ops in doc['providers'][p].values())} ops" for p in PROVIDERS)
    print(f"wrote {args.output} ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
