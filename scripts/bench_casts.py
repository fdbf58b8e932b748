"""Cast counts and validity of fp16 conversions: amp-convert (O1, O2) next to
onnxconverter-common's and onnxruntime's float16 converters, on every zoo
model, in the same run.

For each converter and model it prints: Cast nodes in the result, whether
the result passes the full ONNX checker, whether it loads and runs in
onnxruntime (CPU), and the max relative error of the outputs against fp32.

    python scripts/bench_casts.py [--markdown] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from tables import print_table  # noqa: E402

from amp_convert import convert  # noqa: E402
from amp_convert.cleanup import count_casts  # noqa: E402
from models.zoo_inputs import load_manifest, make_inputs, manifest_paths  # noqa: E402

ort.set_default_logger_severity(3)


def amp(level: str):
    def run(model: onnx.ModelProto) -> onnx.ModelProto:
        return convert(model, level=level, check="none").model

    return run


def onnxconverter_common(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(model, keep_io_types=True)


def ort_transformers(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers import float16

    return float16.convert_float_to_float16(model, keep_io_types=True)


CONVERTERS = {
    "amp-convert O1": amp("O1"),
    "amp-convert O2": amp("O2"),
    "amp-convert O3": amp("O3"),
    "onnxconverter-common": onnxconverter_common,
    "ort float16": ort_transformers,
}


def outputs(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rel_error(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    worst = 0.0
    for r, o in zip(ref, out, strict=True):
        if r.dtype.kind != "f" or r.shape != o.shape:
            continue
        r64, o64 = r.astype(np.float64), o.astype(np.float64)
        if not np.isfinite(o64).all():
            return float("inf")
        worst = max(worst, float(np.max(np.abs(r64 - o64)) / (np.max(np.abs(r64)) + 1e-12)))
    return worst


def measure(entry: dict, name: str, fn) -> dict:
    model = onnx.load(entry["path"])
    feeds = make_inputs(entry, seed=0)
    ref = outputs(model, feeds)
    row = {"casts": "-", "checker": "-", "runs": "-", "rel_err": "-", "seconds": "-"}
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(model)
    except Exception as e:
        row["casts"] = f"failed: {type(e).__name__}"
        return row
    row["seconds"] = f"{time.perf_counter() - t:.2f}"
    row["casts"] = str(count_casts(result))
    try:
        onnx.checker.check_model(result, full_check=True)
        row["checker"] = "ok"
    except Exception as e:
        row["checker"] = f"FAIL ({str(e).splitlines()[0][:60]})"
    try:
        row["rel_err"] = f"{rel_error(ref, outputs(result, feeds)):.2e}"
        row["runs"] = "ok"
    except Exception as e:
        row["runs"] = f"FAIL ({str(e).splitlines()[0][:60]})"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--only", default="", help="comma-separated model names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    entries = [e for p in manifest_paths(include_cache=True) if "full" not in p for e in load_manifest(p)]
    entries = [e for e in entries if not only or e["name"] in only]
    header = ["model", "nodes", "casts in fp32", *CONVERTERS]
    rows = []
    for entry in entries:
        model = onnx.load(entry["path"])
        row = [entry["name"], str(len(model.graph.node)), str(count_casts(model))]
        for name, fn in CONVERTERS.items():
            m = measure(entry, name, fn)
            cell = m["casts"]
            if m["checker"] != "ok" or m["runs"] != "ok":
                cell += f" [checker {m['checker']}, ort {m['runs']}]"
            else:
                cell += f" (err {m['rel_err']})"
            row.append(cell)
        rows.append(row)
        print(" | ".join(row), file=sys.stderr, flush=True)
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
