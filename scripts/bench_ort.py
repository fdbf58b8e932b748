"""onnxruntime-optimized graphs and onnxruntime's fusions: amp-convert against the peers, in one run.

Two tables (markdown), figures as measured now:

1. Optimized transformer graphs (models/zoo/ort, and models/cache/ort when
   `make zoo-ort-full` built the full-size ones) at O2 fp16: fused ops low,
   share of the GEMM family's weights stored fp16, Casts, size, whether
   onnxruntime (CPU) loads and runs the result, and the verdict; for
   amp-convert (the command, validated as by default), onnxruntime's own
   converter (``OnnxModel.convert_float_to_float16(keep_io_types=True)``)
   and onnxconverter-common (``convert_float_to_float16(keep_io_types=True)``).
2. The zoo's CNNs at O2 fp16 after onnxruntime's basic graph optimizations
   (Conv+BatchNormalization fusion among them): BatchNormalization nodes
   left and Casts (onnxruntime's own inserted Casts for the CPU provider's
   missing fp16 kernels not counted), for the same three converters.

    .venv/bin/python scripts/bench_ort.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnxconverter_common import float16
from onnxruntime.transformers.onnx_model import OnnxModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_convert.op_profiles import ORT_FUSED  # noqa: E402
from models.zoo_inputs import load_manifest, make_inputs  # noqa: E402

ort.set_default_logger_severity(3)
GEMMS = {"MatMul", "Gemm", *(k.split("::")[1] for k, v in ORT_FUSED.items() if v[0] == "white")}
FUSED = {k.split("::")[-1] for k in ORT_FUSED}
CNNS = ("resnet50", "mobilenetv3", "convnext", "detector")


def ort_converter(path: Path) -> onnx.ModelProto:
    m = OnnxModel(onnx.load(str(path)))
    m.convert_float_to_float16(keep_io_types=True)
    return m.model


def occ_converter(path: Path) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)


def ours(path: Path, out: Path) -> tuple[onnx.ModelProto, str]:
    """The command as a user runs it: O2, validated by default. The model, and its verdict line."""
    exe = Path(sys.executable).with_name("amp-convert")
    proc = subprocess.run(
        [str(exe), str(path), "--level", "O2", "-o", str(out), "--write-on-fail"], capture_output=True, text=True
    )
    verdict = next(
        (x.split(":")[0] for x in proc.stdout.splitlines() if x.startswith(("PASS", "FAIL"))), f"exit {proc.returncode}"
    )
    return onnx.load(str(out)), verdict


def low_weight_share(model: onnx.ModelProto) -> float:
    tensors = {t.name: t for t in model.graph.initializer}
    low = total = 0
    for node in model.graph.node:
        if node.op_type in GEMMS:
            for name in node.input[1:]:
                t = tensors.get(name)
                if t is not None and t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
                    size = int(np.prod(t.dims))
                    total += size
                    low += size if t.data_type == TensorProto.FLOAT16 else 0
    return low / total if total else 0.0


def fused_low(model: onnx.ModelProto) -> tuple[int, int]:
    """(fused ops whose float data is fp16, fused ops): a fused op is low when its first output is fp16."""
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.output, *model.graph.input)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    produced_low = set()
    for node in model.graph.node:  # (an output without value_info: low when a float input is)
        if node.op_type == "Cast":
            if next(a.i for a in node.attribute if a.name == "to") == TensorProto.FLOAT16:
                produced_low.add(node.output[0])
        elif any(types.get(x) == TensorProto.FLOAT16 or x in produced_low for x in node.input):
            produced_low.update(node.output)
    fused = [n for n in model.graph.node if n.op_type in FUSED and n.domain in ("com.microsoft", "")]
    low = sum(types.get(n.output[0]) == TensorProto.FLOAT16 or n.output[0] in produced_low for n in fused)
    return low, len(fused)


def runs(model: onnx.ModelProto, entry: dict) -> str:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, make_inputs(entry))
        return "yes"
    except Exception as e:  # (a peer's model the runtime refuses is a row, not a crash)
        return f"no ({type(e).__name__})"


def transformer_table() -> list[str]:
    entries = load_manifest(str(ROOT / "models" / "zoo" / "ort" / "manifest.json"))
    full = ROOT / "models" / "cache" / "ort" / "manifest.json"
    if full.is_file():
        entries += [{**e, "name": e["name"] + " (full)"} for e in load_manifest(str(full))]
    rows = [
        "| model | converter | fused ops low | GEMM weights fp16 | Casts | MB | loads and runs | verdict | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for entry in entries:
            path = Path(entry["path"])
            converters: list[tuple[str, Callable[[Path], tuple[onnx.ModelProto, str]]]] = [
                ("amp-convert O2", lambda p: ours(p, Path(tmp) / "ours.onnx")),
                ("onnxruntime", lambda p: (ort_converter(p), "-")),
                ("onnxconverter-common", lambda p: (occ_converter(p), "-")),
            ]
            for label, convert in converters:
                start = time.perf_counter()
                try:
                    model, verdict = convert(path)
                except Exception as e:  # (a peer that fails on a graph is a row)
                    rows.append(f"| {entry['name']} | {label} | failed: {type(e).__name__}: {str(e)[:60]} | | | | | | |")
                    continue
                seconds = time.perf_counter() - start
                low, fused = fused_low(model)
                casts = sum(n.op_type == "Cast" for n in model.graph.node)
                mb = model.ByteSize() / 1e6
                rows.append(
                    f"| {entry['name']} | {label} | {low}/{fused} | {low_weight_share(model):.0%} | {casts} | {mb:.2f} | "
                    f"{runs(model, entry)} | {verdict} | {seconds:.2f} |"
                )
    return rows


def after_onnxruntime(model: onnx.ModelProto, folder: Path, name: str) -> Counter:
    src, dst = folder / f"{name}.onnx", folder / f"{name}.opt.onnx"
    onnx.save(model, str(src))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(dst)).graph.node if not n.name.startswith("InsertedPrecisionFreeCast"))


def cnn_table() -> list[str]:
    entries = {e["name"]: e for e in load_manifest(str(ROOT / "models" / "zoo" / "manifest.json"))}
    rows = [
        "| model | BN in the input | converter | BatchNormalization left | Casts | nodes |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in CNNS:
            path = Path(entries[name]["path"])
            given = sum(n.op_type == "BatchNormalization" for n in onnx.load(str(path)).graph.node)
            converters: list[tuple[str, Callable[[Path], onnx.ModelProto]]] = [
                ("amp-convert O2", lambda p: ours(p, folder / "ours.onnx")[0]),
                ("onnxruntime", ort_converter),
                ("onnxconverter-common", occ_converter),
            ]
            for label, convert in converters:
                try:
                    ops = after_onnxruntime(convert(path), folder, "m")
                except Exception as e:  # (a peer's model the runtime refuses is a row)
                    rows.append(f"| {name} | {given} | {label} | failed: {type(e).__name__}: {str(e)[:60]} | | |")
                    continue
                rows.append(f"| {name} | {given} | {label} | {ops['BatchNormalization']} | {ops['Cast']} | {sum(ops.values())} |")
    return rows


def main() -> int:
    machine = f"{platform.machine()}, {platform.python_version()}, onnxruntime {ort.__version__}, onnx {onnx.__version__}"
    print(f"# bench_ort ({machine})\n")
    print("## onnxruntime-optimized transformer graphs, O2 fp16\n")
    print("\n".join(transformer_table()))
    print("\n## CNNs after onnxruntime's basic optimizations, O2 fp16\n")
    print("\n".join(cnn_table()))
    print(json.dumps({"done": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
