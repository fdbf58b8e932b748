"""Inference latency of the fp32 model, of amp-convert's O1/O2/O3 fp16 and
bf16 conversions, and of the peers' fp16 conversions, in the same run.

Median of ``--runs`` timed runs after ``--warmup`` runs; on CUDA the inputs
and outputs are bound to the device once (IO binding), so the figures are
the model's, not the copies'. onnxruntime's CPU provider has no bf16
kernels: bf16 rows are skipped there and say so.

    python scripts/bench_latency.py [--provider auto|cuda|cpu] [--full] [--only resnet50,bert]
        [--batch resnet50=32 --batch bert=8 --seq bert=128] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from tables import print_table  # noqa: E402

from amp_convert import convert  # noqa: E402
from amp_convert.runner import choose_provider  # noqa: E402
from models.zoo_inputs import load_manifest, make_inputs  # noqa: E402


def variants(model: onnx.ModelProto):
    """(label, dtype, builder) of every conversion to time."""
    yield "fp32", "fp32", lambda: model
    for dtype in ("fp16", "bf16"):
        for level in ("O1", "O2", "O3"):
            yield (
                f"amp {level}",
                dtype,
                lambda level=level, dtype=dtype: (
                    convert(model, level=level, dtype=dtype, check="basic", target_opset=22 if dtype == "bf16" else None).model
                ),
            )

    def occ():
        from onnxconverter_common import float16

        return float16.convert_float_to_float16(model, keep_io_types=True)

    def ortf16():
        from onnxruntime.transformers import float16

        return float16.convert_float_to_float16(model, keep_io_types=True)

    yield "onnxconverter-common", "fp16", occ
    yield "ort float16", "fp16", ortf16


def time_session(model: onnx.ModelProto, feeds: dict[str, np.ndarray], provider: str, warmup: int, runs: int) -> float:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=providers)
    if provider == "cuda":
        binding = sess.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for out in sess.get_outputs():
            binding.bind_output(out.name, "cuda")

        def once() -> None:
            sess.run_with_iobinding(binding)
    else:

        def once() -> None:
            sess.run(None, feeds)

    for _ in range(warmup):
        once()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000.0


def resized_inputs(entry: dict, batch: int | None, seq: int | None) -> dict[str, np.ndarray]:
    specs = []
    for spec in entry["inputs"]:
        shape = list(spec["shape"])
        if batch and shape:
            shape[0] = batch
        if seq and len(shape) == 2:
            shape[1] = seq
        specs.append({**spec, "shape": shape})
    return make_inputs({**entry, "inputs": specs}, seed=0)


def free_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with a symbolic first dimension on its inputs and outputs:
    some zoo exports fix the batch at 1 (their graphs do not depend on it)."""
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            dims[0].dim_param = "batch"
    del model.graph.value_info[:]  # recomputed by onnxruntime
    return model


def parse_map(values: list[str]) -> dict[str, int]:
    out = {}
    for v in values:
        name, _, n = v.partition("=")
        out[name] = int(n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--full", action="store_true", help="full-size models from models/cache/full (make zoo-full)")
    parser.add_argument("--only", default="resnet50,bert")
    parser.add_argument("--batch", action="append", default=[], help="NAME=N")
    parser.add_argument("--seq", action="append", default=[], help="NAME=N (2-D token inputs)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    provider, why = choose_provider(args.provider)
    manifest = ROOT / "models" / ("cache/full" if args.full else "zoo") / "manifest.json"
    only = {n for n in args.only.split(",") if n}
    batches, seqs = parse_map(args.batch), parse_map(args.seq)
    rows = []
    for entry in load_manifest(str(manifest)):
        if only and entry["name"] not in only:
            continue
        model = onnx.load(entry["path"])
        if batches.get(entry["name"]):
            model = free_batch(model)
        feeds = resized_inputs(entry, batches.get(entry["name"]), seqs.get(entry["name"]))
        shape = " ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in feeds.items())
        base = None
        for label, dtype, build in variants(model):
            if dtype == "bf16" and provider == "cpu":
                rows.append((entry["name"], shape, label, dtype, "skipped: no bf16 kernels on the CPU provider", ""))
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    converted = build()
                ms = time_session(converted, feeds, provider, args.warmup, args.runs)
            except Exception as e:
                rows.append((entry["name"], shape, label, dtype, f"failed: {str(e).splitlines()[0][:70]}", ""))
                continue
            base = ms if label == "fp32" else base
            ratio = f"{ms / base:.2f}x" if base else ""
            rows.append((entry["name"], shape, label, dtype, f"{ms:.2f}", ratio))
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ("model", "inputs", "conversion", "dtype", "median ms", "vs fp32")
    print(f"provider: {provider} ({why})")
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
