"""``--level auto`` against onnxconverter-common's auto_convert_mixed_precision,
in the same run, on the fp16-hostile models and the zoo.

For each model and tool: whether the result passes amp-convert's validation
(emulated fp16 on CPU, default tolerance, the same seeded inputs for both),
the fraction of the float compute (MACs for GEMM-like ops) that runs in
fp16, the number of trials (convert + run attempts), the wall time and the
Cast count. The peer searches with its own criterion, which we set to the
same tolerance on the outputs (it runs real fp16 onnxruntime sessions).
Each tool's time is the median of ``--repeat`` runs after one untimed
warm-up run (first calls pay one-off costs: onnxruntime's and the schema
caches' start-up).

    python scripts/bench_auto.py [--markdown] [--only NAME,...] [--max-trials 12] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import manifest_source  # noqa: E402
from tables import print_table  # noqa: E402

from amp_convert import ConvertOptions  # noqa: E402
from amp_convert.auto import auto_convert, compute_weights  # noqa: E402
from amp_convert.calibrate import calibrate  # noqa: E402
from amp_convert.cleanup import count_casts  # noqa: E402
from amp_convert.graph import build_context  # noqa: E402
from amp_convert.inputs import make_source  # noqa: E402
from amp_convert.schema import model_opsets  # noqa: E402
from amp_convert.tolerance import DEFAULT_TOLERANCES  # noqa: E402
from amp_convert.typeinfo import infer_types  # noqa: E402
from amp_convert.validation import ValidationConfig, validate  # noqa: E402
from models.hostile import HOSTILE  # noqa: E402
from models.zoo_inputs import load_manifest  # noqa: E402

CPU = ValidationConfig(provider="cpu", per_node=False)
TOL = DEFAULT_TOLERANCES["fp16"]


def cases(only: set[str]):
    for name, build in HOSTILE.items():
        m = build()
        yield name, m, make_source(m, samples=2)
    pypi = ROOT / "models" / "cache" / "pypi" / "manifest.json"  # real models from PyPI wheels (make pypi-models)
    for manifest in (ROOT / "models" / "zoo" / "manifest.json", pypi):
        if not manifest.is_file():
            continue
        for entry in load_manifest(str(manifest)):
            m = onnx.load(entry["path"])
            yield entry["name"], m, manifest_source(entry, m)


def low_fraction_of(model: onnx.ModelProto, reference: onnx.ModelProto, weights: dict[str, float]) -> float:
    """Compute-weighted share of the reference's float nodes that write fp16 in
    ``model`` (nodes are matched by name, which both converters keep)."""
    ref = build_context(reference.graph)
    infer_types(ref, model_opsets(reference))
    cand = build_context(model.graph)
    infer_types(cand, model_opsets(model))
    by_name = {n.name: n for n in cand.nodes if n.name}
    low = total = 0.0
    for i, node in enumerate(ref.nodes):
        if not any(o and ref.types.get(o) == onnx.TensorProto.FLOAT for o in node.output):
            continue
        w = weights.get(ref.node_label(i), 1.0)
        total += w
        twin = by_name.get(node.name)
        if twin is not None and any(cand.types.get(o) == onnx.TensorProto.FLOAT16 for o in twin.output):
            low += w
    return low / total if total else 0.0


def peer_auto(reference: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """onnxconverter-common's search, with our tolerance as its criterion; counts attempts."""
    from onnxconverter_common import auto_mixed_precision, float16

    attempts = 0
    original = float16.convert_float_to_float16

    def counting(*args, **kwargs):
        nonlocal attempts
        attempts += 1
        return original(*args, **kwargs)

    def within(res_ref, res_cand) -> bool:
        for r, c in zip(res_ref, res_cand, strict=False):
            r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
            if r64.shape != c64.shape or not np.isfinite(c64).all():
                return False
            if r64.dtype.kind == "f" and np.max(np.abs(r64 - c64), initial=0) > TOL.atol + TOL.rtol * np.max(
                np.abs(r64), initial=0
            ):
                return False
        return True

    float16.convert_float_to_float16 = counting
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            result = auto_mixed_precision.auto_convert_mixed_precision(reference, feeds, validate_fn=within, keep_io_types=True)
    finally:
        float16.convert_float_to_float16 = original
    return result, attempts


def timed(run, repeat: int):
    """``run()``'s result and the median wall time of ``repeat`` runs after a
    warm-up run, each started from a collected heap (the garbage of earlier
    models and tools would otherwise be scanned on the clock of whichever
    tool allocates next)."""
    result = run()
    times = []
    for _ in range(repeat):
        result = None
        gc.collect()
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
    return result, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--max-trials", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tool and model (median)")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    rows = []
    for name, reference, source in cases(only):
        if only and name not in only:
            continue

        def amp_search(reference=reference, source=source):
            calibration = calibrate(reference, source, "cpu")  # part of auto's cost: timed
            searched = auto_convert(
                reference, ConvertOptions(), source, ValidationConfig(provider="cpu"), calibration, args.max_trials
            )
            return searched, calibration

        (searched, calibration), amp_time = timed(amp_search, args.repeat)
        weights = compute_weights(reference, calibration)
        amp_pass = searched.validation is not None and searched.validation.passed
        amp = (
            "pass" if amp_pass else "fp32 fallback",
            f"{searched.low_compute:.1%}",
            str(len(searched.trials)),
            f"{amp_time:.3f}",
            str(count_casts(searched.conversion.model)),
        )

        feeds = next(iter(source))
        t0 = time.perf_counter()
        try:
            (peer_model, attempts), peer_time = timed(
                lambda reference=reference, feeds=feeds: peer_auto(reference, feeds), args.repeat
            )
            try:
                v = validate(reference, peer_model, source, CPU)
                verdict = "pass" if v.passed else "FAIL"
            except Exception as e:  # the peer's model may not even load
                verdict = f"invalid ({str(e).splitlines()[0][:50]})"
            peer = (
                verdict,
                f"{low_fraction_of(peer_model, reference, weights):.1%}",
                str(attempts),
                f"{peer_time:.3f}",
                str(count_casts(peer_model)),
            )
        except Exception as e:
            peer = (f"error: {type(e).__name__}: {str(e).splitlines()[0][:60]}", "-", "-", f"{time.perf_counter() - t0:.1f}", "-")
        row = (name, *amp, *peer)
        rows.append(row)
        print(" | ".join(row), file=sys.stderr, flush=True)
    header = (
        "model",
        "amp auto",
        "low compute",
        "trials",
        "seconds",
        "casts",
        "peer auto",
        "low compute",
        "trials",
        "seconds",
        "casts",
    )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
