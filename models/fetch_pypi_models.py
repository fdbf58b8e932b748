"""Fetch real (trained) ONNX models that PyPI packages ship inside their wheels.

Runs with any Python that has pip; torch is not needed. onnx and onnxruntime
are optional: with onnx the manifest's opset/IR/checker fields are computed
from the files (otherwise the values recorded below are used), with
onnxruntime each model is also run once on its manifest inputs.

    python models/fetch_pypi_models.py            # -> models/cache/pypi/*.onnx + manifest.json
    python models/fetch_pypi_models.py --force    # download and extract again
    python models/fetch_pypi_models.py --only ppocr_det,silero_vad

Files already present (with the expected sha256) are not downloaded again.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "cache", "pypi")


def _f(name: str, shape: list[int], low: float, high: float) -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": "float32", "low": low, "high": high}


_SILERO_STATE = _f("state", [2, 1, 128], -0.5, 0.5)
_SILERO_INPUT = _f("input", [1, 512], -1.0, 1.0)  # one 32 ms chunk at 16 kHz
_SILERO_SR = {
    "name": "sr",
    "shape": [],
    "dtype": "int64",
    "low": 16000,
    "high": 16001,
    "value": 16000,
}

# Each model: where it lives in which wheel, what to feed it, and what was
# observed when this table was written (used when onnx is not installed).
PACKAGES: list[dict[str, Any]] = [
    {
        "package": "rapidocr-onnxruntime",
        "version": "1.4.4",
        "models": [
            {
                "name": "ppocr_det",
                "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "sha256": "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                "source": "PP-OCRv4 text detection (DBNet, PPLCNetV3 backbone), trained weights, "
                "from rapidocr-onnxruntime 1.4.4 wheel (Paddle2ONNX)",
                # dynamic [N,3,H,W]; H, W multiples of 32
                "inputs": [_f("x", [1, 3, 64, 64], 0.0, 1.0)],
                "outputs": ["sigmoid_0.tmp_0"],
                "opset": 12,
                "ir_version": 8,
                "checker_ok": True,
            },
            {
                "name": "ppocr_rec",
                "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "sha256": "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                "source": "PP-OCRv4 text recognition (SVTR-LCNet, CTC head, 6625 classes), trained weights, "
                "from rapidocr-onnxruntime 1.4.4 wheel (Paddle2ONNX)",
                # dynamic [N,3,48,W]
                "inputs": [_f("x", [1, 3, 48, 160], -1.0, 1.0)],
                "outputs": ["softmax_11.tmp_0"],
                "opset": 12,
                "ir_version": 8,
                "checker_ok": True,
            },
            {
                "name": "ppocr_cls",
                "member": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "sha256": "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                "source": "PP-OCR mobile v2.0 text direction classifier (MobileNetV3-small), trained weights, "
                "from rapidocr-onnxruntime 1.4.4 wheel (Paddle2ONNX)",
                # dynamic [N,3,H,W]; PP-OCR feeds 48x192
                "inputs": [_f("x", [1, 3, 48, 192], -1.0, 1.0)],
                "outputs": ["save_infer_model/scale_0.tmp_1"],
                "opset": 11,
                "ir_version": 7,
                "checker_ok": True,
            },
        ],
    },
    {
        "package": "silero-vad",
        "version": "6.2.3",
        "models": [
            {
                "name": "silero_vad",
                "member": "silero_vad/data/silero_vad.onnx",
                "sha256": "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                "source": "Silero VAD v6 (STFT conv + LSTM), trained weights, 8k/16k branches selected by If "
                "on sr, from silero-vad 6.2.3 wheel",
                "inputs": [_SILERO_INPUT, _SILERO_STATE, _SILERO_SR],
                "outputs": ["output", "stateN"],
                "opset": 16,
                "ir_version": 8,
                "checker_ok": True,
            },
            {
                "name": "silero_vad_half",
                "member": "silero_vad/data/silero_vad_half.onnx",
                "sha256": "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
                "source": "Silero VAD v6, 16 kHz-only variant (no sr input; weights float32 despite the file "
                "name), If nodes, from silero-vad 6.2.3 wheel",
                "inputs": [_SILERO_INPUT, _SILERO_STATE],
                "outputs": ["output", "stateN"],
                "opset": 16,
                "ir_version": 8,
                "checker_ok": True,
            },
            {
                "name": "silero_vad_op18_ifless",
                "member": "silero_vad/data/silero_vad_op18_ifless.onnx",
                "sha256": "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
                "source": "Silero VAD v6, opset 18 variant without If nodes, from silero-vad 6.2.3 wheel",
                "inputs": [_SILERO_INPUT, _SILERO_SR, _SILERO_STATE],
                "outputs": ["output", "stateN"],
                "opset": 18,
                "ir_version": 10,
                "checker_ok": True,
            },
        ],
    },
]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(package: str, version: str, dest: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{package}=={version}",
        "-d",
        dest,
    ]
    print("  $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    norm = package.replace("-", "_").lower()
    wheels = [w for w in glob.glob(os.path.join(dest, "*.whl")) if os.path.basename(w).lower().startswith(norm + "-")]
    if not wheels:
        raise RuntimeError(f"pip download produced no wheel for {package}=={version} in {dest}")
    return wheels[0]


def inspect_model(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Fields computed from the file when onnx is importable, else the recorded ones."""
    info = {k: spec[k] for k in ("opset", "ir_version", "outputs", "checker_ok")}
    try:
        import onnx
    except ImportError:
        info["inspected"] = False
        return info
    model = onnx.load(path)
    info["opset"] = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    info["ir_version"] = model.ir_version
    info["outputs"] = [o.name for o in model.graph.output]
    try:
        onnx.checker.check_model(model, full_check=True)
        info["checker_ok"] = True
    except Exception as e:  # still a useful model: record it
        info["checker_ok"] = False
        info["checker_error"] = f"{type(e).__name__}: {e}"[:500]
    for key in ("opset", "ir_version", "outputs", "checker_ok"):
        if info[key] != spec[key]:
            print(f"  note: {spec['name']}: {key} is {info[key]!r}, table says {spec[key]!r}")
    info["inspected"] = True
    ops = list(_iter_op_types(model.graph))
    info["node_count"] = len(ops)
    info["notable_ops"] = [op for op in NOTABLE_OPS if op in ops]
    return info


NOTABLE_OPS = (
    "If",
    "Loop",
    "LSTM",
    "GRU",
    "Resize",
    "ConvTranspose",
    "BatchNormalization",
    "LayerNormalization",
    "Softmax",
    "HardSigmoid",
    "HardSwish",
    "Clip",
    "Pow",
    "Sqrt",
    "Sigmoid",
    "Tanh",
    "Conv",
    "MatMul",
    "Gemm",
    "ReduceMean",
)


def _iter_op_types(graph):
    for node in graph.node:
        yield node.op_type
        for attr in node.attribute:
            if attr.g.node:
                yield from _iter_op_types(attr.g)
            for g in attr.graphs:
                yield from _iter_op_types(g)


def verify_ort(path: str, entry: dict[str, Any]) -> str:
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime not installed: not run"
    sys.path.insert(0, HERE)
    from zoo_inputs import make_inputs

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, make_inputs(entry, seed=0))
    parts = []
    for name, o in zip(entry["outputs"], outs, strict=False):
        o = np.asarray(o)
        if np.issubdtype(o.dtype, np.floating) and not np.all(np.isfinite(o)):
            raise RuntimeError(f"{entry['name']}: output {name} has non-finite values")
        parts.append(f"{name}{list(o.shape)}")
    return "ran: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help="output directory (default: models/cache/pypi)",
    )
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--force", action="store_true", help="download and extract even if present")
    ap.add_argument("--no-run", action="store_true", help="do not run the models in onnxruntime")
    args = ap.parse_args(argv)

    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    known = {m["name"] for p in PACKAGES for m in p["models"]}
    if wanted - known:
        ap.error(f"unknown model(s) {sorted(wanted - known)}; known: {sorted(known)}")
    os.makedirs(args.out, exist_ok=True)

    manifest_path = os.path.join(args.out, "manifest.json")
    entries: dict[str, dict[str, Any]] = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            entries = {e["name"]: e for e in json.load(f).get("models", [])}

    failures = []
    for pkg in PACKAGES:
        specs = [m for m in pkg["models"] if not wanted or m["name"] in wanted]
        if not specs:
            continue
        missing = [
            m
            for m in specs
            if args.force
            or not os.path.isfile(os.path.join(args.out, m["name"] + ".onnx"))
            or sha256_file(os.path.join(args.out, m["name"] + ".onnx")) != m["sha256"]
        ]
        print(f"{pkg['package']}=={pkg['version']}: {len(specs) - len(missing)} cached, {len(missing)} to extract")
        if missing:
            try:
                with tempfile.TemporaryDirectory(prefix="pypi-models-") as tmp:
                    wheel = download_wheel(pkg["package"], pkg["version"], tmp)
                    with zipfile.ZipFile(wheel) as zf:
                        for m in missing:
                            data = zf.read(m["member"])
                            digest = hashlib.sha256(data).hexdigest()
                            if digest != m["sha256"]:
                                print(f"  warning: {m['name']}: sha256 {digest} differs from the recorded one")
                            dst = os.path.join(args.out, m["name"] + ".onnx")
                            with open(dst + ".tmp", "wb") as f:
                                f.write(data)
                            os.replace(dst + ".tmp", dst)
                            print(f"  extracted {m['member']} -> {dst} ({len(data) / 1e6:.2f} MB)")
            except Exception as e:
                print(f"  FAILED to fetch {pkg['package']}=={pkg['version']}: {e}")
                failures += [m["name"] for m in missing]
                continue

        for m in specs:
            path = os.path.join(args.out, m["name"] + ".onnx")
            if not os.path.isfile(path):
                continue
            info = inspect_model(path, m)
            entry: dict[str, Any] = {
                "name": m["name"],
                "file": m["name"] + ".onnx",
                "source": m["source"],
                "package": f"{pkg['package']}=={pkg['version']}",
                "member": m["member"],
                "sha256": sha256_file(path),
                "opset": info["opset"],
                "ir_version": info["ir_version"],
                "inputs": m["inputs"],
                "outputs": info["outputs"],
                "checker_ok": info["checker_ok"],
                "size_bytes": os.path.getsize(path),
            }
            for key in ("checker_error", "node_count", "notable_ops"):
                if key in info:
                    entry[key] = info[key]
            status = "not run"
            if not args.no_run:
                try:
                    status = verify_ort(path, entry)
                except Exception as e:
                    status = f"FAILED in onnxruntime: {type(e).__name__}: {str(e)[:300]}"
                    failures.append(m["name"])
            entries[m["name"]] = entry
            print(
                f"  [{m['name']}] {entry['size_bytes'] / 1e6:.2f} MB opset {entry['opset']} ir {entry['ir_version']} "
                f"checker_ok={entry['checker_ok']} {status}"
            )

    order = [m["name"] for p in PACKAGES for m in p["models"]]
    models = sorted(
        entries.values(),
        key=lambda e: order.index(e["name"]) if e["name"] in order else len(order),
    )
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, indent=1)
        f.write("\n")
    print(f"wrote {manifest_path}: {len(models)} models")
    if failures:
        print(f"FAILED: {failures}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
