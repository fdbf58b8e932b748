"""Load and run every model of the zoo manifests in onnxruntime (CPU).

Runs with the main venv (onnx, onnxruntime, numpy; no torch):

    .venv/bin/python models/check_zoo.py                  # zoo + caches that exist
    .venv/bin/python models/check_zoo.py --no-cache       # committed zoo only
    .venv/bin/python models/check_zoo.py --only bert,gpt2 --top 12
    .venv/bin/python models/check_zoo.py --manifest models/cache/full/manifest.json

For each model: node count (subgraphs included), the most common op types,
file size, and per-output shape/dtype/min/max/mean. Exits 1 if a model
fails to load or run, or gives non-finite outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from zoo_inputs import iter_nodes, load_manifest, make_inputs, manifest_paths


def describe(arr: np.ndarray) -> str:
    arr = np.asarray(arr)
    head = f"{list(arr.shape)} {arr.dtype}"
    if arr.size == 0:
        return head + " (empty)"
    if np.issubdtype(arr.dtype, np.floating):
        a = arr.astype(np.float64)
        finite = np.isfinite(a)
        if not finite.all():
            return head + f" NON-FINITE: {int((~finite).sum())} of {a.size}"
        return head + f" min {a.min():.4g} max {a.max():.4g} mean {a.mean():.4g} std {a.std():.4g}"
    if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        return head + f" min {arr.min()} max {arr.max()}"
    return head


def check_entry(entry: dict, top: int, seed: int) -> bool:
    path = entry["path"]
    name = entry["name"]
    if not os.path.isfile(path):
        print(f"[{name}] MISSING {path}")
        return False
    size = os.path.getsize(path)
    model = onnx.load(path)
    hist = Counter(n.op_type for n in iter_nodes(model.graph))
    n_sub = sum(1 for n in iter_nodes(model.graph) if n.op_type in ("If", "Loop", "Scan"))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    print(
        f"[{name}] {size / 1e6:.2f} MB opset {opset} ir {model.ir_version} nodes {sum(hist.values())} "
        f"(top-level {len(model.graph.node)}, control-flow {n_sub}) checker_ok={entry.get('checker_ok')}"
    )
    print("    ops: " + ", ".join(f"{k}:{v}" for k, v in hist.most_common(top)))
    del model

    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feeds = make_inputs(entry, seed=seed)
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        dt = time.perf_counter() - t0
    except Exception as e:
        print(f"    FAILED in onnxruntime: {type(e).__name__}: {str(e)[:300]}")
        return False
    ok = True
    for spec in entry["inputs"]:
        print(f"    in  {spec['name']}: {describe(feeds[spec['name']])}")
    for out_meta, arr in zip(sess.get_outputs(), outs, strict=False):
        desc = describe(arr)
        ok &= "NON-FINITE" not in desc
        print(f"    out {out_meta.name}: {desc}")
    print(f"    onnxruntime run {dt * 1e3:.1f} ms")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--manifest",
        action="append",
        help="manifest path (repeatable); default: all that exist",
    )
    ap.add_argument("--no-cache", action="store_true", help="only models/zoo (skip models/cache/*)")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--top", type=int, default=8, help="how many op types to list")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    manifests = args.manifest or manifest_paths(include_cache=not args.no_cache)
    if not manifests:
        print("no manifest found (build with models/build_zoo.py)")
        return 1
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    failed = []
    count = 0
    for mpath in manifests:
        entries = load_manifest(mpath)
        total = sum(os.path.getsize(e["path"]) for e in entries if os.path.isfile(e["path"]))
        print(f"== {os.path.relpath(mpath)}: {len(entries)} models, {total / 1e6:.2f} MB")
        for entry in entries:
            if only and entry["name"] not in only:
                continue
            count += 1
            if not check_entry(entry, args.top, args.seed):
                failed.append(f"{os.path.relpath(mpath)}:{entry['name']}")
    print(f"checked {count} models, {len(failed)} failed" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
