"""The prepared GPU check: one command for a freshly started CUDA machine (or its CPU path).

Sections, each time-boxed (what does not fit is skipped, with the reason printed):

1. registry: the live kernel registry of onnxruntime's CUDA and CPU providers
   (``get_all_opkernel_def()``, read in a child process as amp_convert.kernels
   reads it), written in the layout of ``amp_convert/data/ort_kernels.json``,
   and its difference from that snapshot (count and first lines per provider).
2. fidelity: every zoo model converted at O1/O2/O3 to fp16 and bf16 (aimed at
   CUDA), run for real on the device and through amp-convert's CPU emulation
   (its Validator, ``--emulate always``), both against the fp32 reference
   (CPU) on the manifest's inputs; max abs / max rel error and cosine of each,
   and emulation / device ratios.
3. latency: median of N IO-bound runs after warm-up of fp32, amp-convert
   O1/O2/O3 fp16, onnxconverter-common's fp16 and onnxruntime's fp16
   converter, for ResNet-50 (batch 32) and BERT-base (batch 8 x 128), full
   size with random weights (exported with torch where torchvision /
   transformers import, else built here with onnx.helper), or the zoo's
   reduced models (``--latency-models zoo``, the CPU path's default).

Everything printed is also written, with the sections' data, to
``OUT/gpu_check.json``; the registry dump to ``OUT/ort_kernels_live.json``.
The CPU path (``--cpu``, or where CUDA does not run) does the same on the CPU
provider: CPU registry only, fp16 only (the "device" run is onnxruntime's CPU
run of the fp16 model), small iteration counts. It exits 0 unless the script
itself breaks; failures of single models are rows, not exit codes.

    python scripts/gpu_check.py [--out DIR] [--cpu] [--only NAME,...] [--iterations N] [--warmup N]
        [--latency-models auto|full|zoo] [--budget SECONDS] [--markdown]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_convert import convert, kernels  # noqa: E402
from amp_convert.inputs import make_source  # noqa: E402
from amp_convert.metrics import ErrorStats  # noqa: E402
from amp_convert.runner import cuda_usable  # noqa: E402
from amp_convert.validation import ValidationConfig, validate  # noqa: E402
from models.zoo_inputs import load_manifest, make_inputs  # noqa: E402

CUDA, CPU = kernels.CUDA, kernels.CPU
LEVELS = ("O1", "O2", "O3")
DIFF_SHOWN = 40
# A second interpreter whose onnxruntime may read the CPU registry where this one's crashes
# (onnxruntime-gpu without the CUDA libraries): the Makefile's CPU-onnxruntime venv.
ORT_CPU_VENV_PYTHON = ROOT / ".venv-ortzoo" / "bin" / "python"
LATENCY_ZOO_DEFAULT = ("resnet50", "bert")

ort.set_default_logger_severity(3)


class Log:
    """Prints lines and keeps them, for the JSON (what was printed is what is written)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        for part in str(line).split("\n"):
            self.lines.append(part)
            print(part, flush=True)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> None:
        if markdown:
            self("| " + " | ".join(header) + " |")
            self("|" + "---|" * len(header))
            for row in rows:
                self("| " + " | ".join(row) + " |")
            return
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


class Deadline:
    """A section's time box: ``left()`` seconds until ``end`` (monotonic clock)."""

    def __init__(self, seconds: float, cap: float) -> None:
        self.end = min(time.monotonic() + seconds, cap)

    def left(self) -> float:
        return self.end - time.monotonic()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def _num(x: Any, fmt: str = ".2e") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return a / b


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# ---------------------------------------------------------------- registry


def _read_registry(python: str, timeout: float) -> tuple[dict | None, str]:
    """The registry as amp_convert.kernels' child prints it, read with ``python``; (None, why) where it gives none."""
    try:
        run = subprocess.run(
            [python, "-c", kernels._CHILD, ",".join(kernels.DOMAINS)],
            capture_output=True,
            text=True,
            timeout=max(timeout, 1.0),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    except OSError as e:
        return None, _first_line(e)
    if run.returncode != 0:
        how = f"killed by signal {-run.returncode}" if run.returncode < 0 else f"exit status {run.returncode}"
        text = re.sub(r"\x1b\[[0-9;]*m", "", run.stderr)  # (onnxruntime colours its log lines)
        tail = [line.strip() for line in text.splitlines() if any(c.isalnum() for c in line)][-1:]
        return None, f"{how}{': ' + tail[0][:160] if tail else ''}"
    try:
        doc = json.loads(run.stdout)
    except json.JSONDecodeError as e:
        return None, f"unreadable output ({e})"
    if not isinstance(doc, dict) or not isinstance(doc.get("providers"), dict):
        return None, "no providers in its output"
    return doc, "ok"


def section_registry(log: Log, on_cuda: bool, out: Path, args: argparse.Namespace, deadline: Deadline) -> dict:
    """Dump the live registry of the providers this path needs and diff it against the snapshot."""
    wanted = [CUDA, CPU] if on_cuda else [CPU]
    log(f"== registry: live kernels of {', '.join(wanted)} (get_all_opkernel_def in a child process)")
    candidates = [sys.executable]
    if args.registry_python:
        candidates.append(args.registry_python)
    if ORT_CPU_VENV_PYTHON.is_file():
        candidates.append(str(ORT_CPU_VENV_PYTHON))
    attempts, found = [], {}
    for python in dict.fromkeys(candidates):
        if all(p in found for p in wanted) or deadline.left() <= 0:
            break
        t = time.perf_counter()
        doc, why = _read_registry(python, min(kernels.LIVE_TIMEOUT_S, deadline.left()))
        listed = sorted(doc["providers"]) if doc else []
        attempts.append(
            {
                "python": python,
                "result": why,
                "release": doc and str(doc["release"]),
                "providers": listed,
                "seconds": round(time.perf_counter() - t, 2),
            }
        )
        log(f"  {python}: {why}" + (f", onnxruntime {doc['release']}, providers {', '.join(listed)}" if doc else ""))
        for p in wanted:
            if doc and p in doc["providers"] and p not in found:
                found[p] = {"python": python, "release": str(doc["release"]), "data": doc["providers"][p]}
    result: dict[str, Any] = {"wanted": wanted, "attempts": attempts, "available": sorted(found), "providers": {}}
    missing = [p for p in wanted if p not in found]
    if missing:
        result["missing_reason"] = f"no live registry of {', '.join(missing)} from {len(attempts)} interpreter(s): see attempts"
        log(f"  no live registry of {', '.join(missing)}")
    if not found:
        return result
    dump = {
        "source": {
            "kind": "live registry",
            "call": "onnxruntime.capi._pybind_state.get_all_opkernel_def()",
            "host": platform.node(),
            "per_provider": {p: {"python": f["python"], "onnxruntime": f["release"]} for p, f in found.items()},
        },
        "onnxruntime_release": found[wanted[0] if wanted[0] in found else next(iter(found))]["release"],
        "providers": {p: f["data"] for p, f in found.items()},
    }
    path = out / "ort_kernels_live.json"
    path.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n")
    result["dump"] = str(path)
    log(f"  dump: {path}")
    for p, f in found.items():
        live = kernels._table(p, f"onnxruntime {f['release']} live registry", f["release"], f["data"])
        snap = kernels.snapshot_table(p)
        lines = kernels.diff_tables(snap, live)
        low = {
            name: sum(1 for key in live.ops() if any(f"tensor({name})" in t for k in live.kernels[key] for t in k.types.values()))
            for name in ("float16", "bfloat16")
        }
        result["providers"][p] = {
            "python": f["python"],
            "release": f["release"],
            "ops": len(live.ops()),
            "ops_with_float16": low["float16"],
            "ops_with_bfloat16": low["bfloat16"],
            "snapshot_release": snap.release,
            "diff_count": len(lines),
            "diff": lines,
        }
        log(
            f"  {p}: {len(live.ops())} ops ({low['float16']} with float16, {low['bfloat16']} with bfloat16 kernels), "
            f"onnxruntime {f['release']}"
        )
        log(f"  snapshot ({snap.release}) vs live: {len(lines)} diff lines" + (f", first {DIFF_SHOWN}:" if lines else ""))
        for line in lines[:DIFF_SHOWN]:
            log(f"    {line}")
    return result


# ---------------------------------------------------------------- sessions


def _providers(device: str) -> list[str]:
    return [CUDA, CPU] if device == "cuda" else [CPU]


def _session(model: onnx.ModelProto, device: str) -> ort.InferenceSession:
    sess = ort.InferenceSession(model.SerializeToString(), providers=_providers(device))
    if device == "cuda" and sess.get_providers()[0] != CUDA:
        raise RuntimeError(f"the session runs on {sess.get_providers()[0]}, not CUDA")
    return sess


def _run(model: onnx.ModelProto, device: str, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    sess = _session(model, device)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def _amp(model: onnx.ModelProto, level: str, dtype: str) -> onnx.ModelProto:
    # Aimed at CUDA on both paths: the CPU path runs the very model a GPU would (onnxruntime's CPU
    # provider computes the fp16 nodes it has no kernels for in float32).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert(model, level=level, dtype=dtype, target_provider="cuda", check="basic").model


def _metrics(stats: dict) -> dict:
    """The three figures of an ErrorStats.as_dict() (None where the output is not a float one)."""
    return {k: _finite(stats.get(k)) for k in ("max_abs_err", "max_rel_err", "cosine")} | {
        "kind": stats.get("kind"),
        "shape_mismatch": stats.get("shape_mismatch", 0),
    }


# ---------------------------------------------------------------- fidelity


def section_fidelity(log: Log, device: str, entries: list[dict], dtypes: Sequence[str], args, deadline: Deadline) -> dict:
    """Device run vs CPU emulation of each conversion, both against the CPU fp32 reference."""
    log(f"== fidelity: {device} run vs amp-convert's CPU emulation, each against fp32 (CPU) on the manifest's inputs")
    rows: list[dict] = []
    skipped: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    for entry in entries:
        name = entry["name"]
        if deadline.left() <= 0:
            skipped.append(f"{name}: over the section's budget")
            continue
        model = onnx.load(entry["path"])
        feeds = make_inputs(entry, seed=0)
        npz = scratch / f"{name}.npz"
        np.savez(npz, **feeds)
        source = make_source(model, inputs=[npz])
        try:
            ref = _run(model, "cpu", feeds)
        except Exception as e:
            rows.append({"model": name, "level": "fp32", "dtype": "fp32", "error": f"reference: {_first_line(e)}"})
            continue
        floats = [n for n, v in ref.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        if device == "cuda":  # the device's own fp32 (TF32 where onnxruntime uses it): the floor under the low runs
            rows += _device_rows(name, "fp32", "fp32", model, device, feeds, ref, floats, None, 0.0)
        for dtype in dtypes:
            for level in LEVELS:
                if deadline.left() <= 0:
                    skipped.append(f"{name} {level} {dtype}: over the section's budget")
                    continue
                t = time.perf_counter()
                try:
                    converted = _amp(model, level, dtype)
                except Exception as e:
                    rows.append({"model": name, "level": level, "dtype": dtype, "error": f"convert: {_first_line(e)}"})
                    continue
                seconds = time.perf_counter() - t
                try:
                    config = ValidationConfig(
                        provider="cpu", emulate="always", per_node=False, pin_choices=False, dtype=dtype, load_check=False
                    )
                    emulated = {o.name: o.as_dict() for o in validate(model, converted, source, config).outputs}
                except Exception as e:
                    emulated = {"__error__": _first_line(e)}
                rows += _device_rows(name, level, dtype, converted, device, feeds, ref, floats, emulated, seconds)
    _print_fidelity(log, rows, device, args.markdown)
    for line in skipped:
        log(f"  skipped {line}")
    return {"device": device, "reference": "fp32 on CPU", "rows": rows, "skipped": skipped}


def _device_rows(name, level, dtype, model, device, feeds, ref, floats, emulated, seconds) -> list[dict]:
    base = {"model": name, "level": level, "dtype": dtype, "convert_s": round(seconds, 3)}
    try:
        values = _run(model, device, feeds)
    except Exception as e:
        values, run_error = None, _first_line(e)
    else:
        run_error = None
    rows = []
    for out in floats:
        row = dict(base, output=out)
        if values is None:
            row["device_error"] = run_error
        else:
            stats = ErrorStats(out)
            stats.update(ref[out], values[out])
            row["device"] = _metrics(stats.as_dict())
        if emulated is not None:
            if "__error__" in emulated:
                row["emulation_error"] = emulated["__error__"]
            elif out in emulated:
                row["emulation"] = _metrics(emulated[out])
        dev, emu = row.get("device"), row.get("emulation")
        if dev and emu:
            one_minus = [None if m["cosine"] is None else 1.0 - m["cosine"] for m in (emu, dev)]
            row["ratio"] = {
                "max_abs_err": _ratio(emu["max_abs_err"], dev["max_abs_err"]),
                "max_rel_err": _ratio(emu["max_rel_err"], dev["max_rel_err"]),
                "one_minus_cosine": _ratio(*one_minus),
            }
        rows.append(row)
    return rows


def _print_fidelity(log: Log, rows: list[dict], device: str, markdown: bool) -> None:
    header = [
        "model",
        "output",
        "level",
        "dtype",
        f"{device} abs",
        f"{device} rel",
        f"{device} cos",
        "emu abs",
        "emu rel",
        "emu cos",
    ]
    header += ["abs emu/dev", "rel emu/dev", "(1-cos) emu/dev", "note"]
    table = []
    for r in rows:
        cells = [r["model"], r.get("output", "-"), r["level"], r["dtype"]]
        notes = [r["error"]] if "error" in r else []
        for side in ("device", "emulation"):
            m = r.get(side)
            if m is None:
                cells += ["-"] * 3
                if f"{side}_error" in r:
                    notes.append(f"{side}: {r[side + '_error']}")
            else:
                cells += [_num(m["max_abs_err"]), _num(m["max_rel_err"]), _num(m["cosine"], ".6f")]
                if m.get("shape_mismatch"):
                    notes.append(f"{side}: shapes differ from the reference's")
        ratio = r.get("ratio", {})
        cells += [_num(ratio.get(k), ".2f") for k in ("max_abs_err", "max_rel_err", "one_minus_cosine")]
        table.append([*cells, "; ".join(notes)[:120]])
    log.table(header, table, markdown)


# ---------------------------------------------------------------- latency models


def _init(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def build_resnet50(batch: str = "N") -> onnx.ModelProto:
    """ResNet-50 v1.5 (torchvision's layout, BatchNormalization folded into the Convs as its export
    folds it), random He-initialised weights, input ``input`` [N, 3, 224, 224], output ``logits`` [N, 1000]."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(x: str, cin: int, cout: int, k: int, stride: int, name: str, gain: float = 1.0, relu: bool = True) -> str:
        w = _init(rng, (cout, cin, k, k), gain * math.sqrt(2.0 / (cin * k * k)))
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(np.zeros(cout, np.float32), f"{name}.b")])
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.y"], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4
            )
        )
        if not relu:
            return f"{name}.y"
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.r"]))
        return f"{name}.r"

    x = conv("input", 3, 64, 7, 2, "conv1")
    nodes.append(helper.make_node("MaxPool", [x], ["pool1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool1", 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            p = f"layer{stage + 1}.{b}"
            h = conv(x, cin, width, 1, 1, f"{p}.conv1")
            h = conv(h, width, width, 3, stride, f"{p}.conv2")
            # (small last conv of each block: the residual sum stays near unit scale without BatchNorm)
            h = conv(h, width, width * 4, 1, 1, f"{p}.conv3", gain=0.2, relu=False)
            short = conv(x, cin, width * 4, 1, stride, f"{p}.down", relu=False) if b == 0 else x
            nodes.append(helper.make_node("Add", [h, short], [f"{p}.sum"]))
            nodes.append(helper.make_node("Relu", [f"{p}.sum"], [f"{p}.out"]))
            x, cin = f"{p}.out", width * 4
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    inits.extend(
        [
            numpy_helper.from_array(_init(rng, (1000, 2048), 0.02), "fc.w"),
            numpy_helper.from_array(np.zeros(1000, np.float32), "fc.b"),
        ]
    )
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes,
        "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 1000])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="gpu_check")


def build_bert_base(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, vocab: int = 30522) -> onnx.ModelProto:
    """BERT-base (Hugging Face's BertModel layout: post-LayerNorm, Erf GELU, additive attention mask of
    float32's lowest value, tanh pooler), random weights (std 0.02). Inputs input_ids, attention_mask,
    token_type_ids [B, S] int64 (S <= 512); outputs last_hidden_state [B, S, hidden], pooler_output [B, hidden]."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    head_dim = hidden // heads

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def linear(x: str, cin: int, cout: int, name: str) -> str:
        w = const(f"{name}.w", _init(rng, (cin, cout), 0.02))
        b = const(f"{name}.b", np.zeros(cout, np.float32))
        return node("Add", [node("MatMul", [x, w], f"{name}.mm"), b], f"{name}.y")

    def layer_norm(x: str, name: str) -> str:
        g, b = const(f"{name}.g", np.ones(hidden, np.float32)), const(f"{name}.b", np.zeros(hidden, np.float32))
        return node("LayerNormalization", [x, g, b], f"{name}.y", axis=-1, epsilon=1e-12)

    word = node("Gather", [const("emb.word", _init(rng, (vocab, hidden), 0.02)), "input_ids"], "emb.w")
    kind = node("Gather", [const("emb.type", _init(rng, (2, hidden), 0.02)), "token_type_ids"], "emb.t")
    seq = node("Gather", [node("Shape", ["input_ids"], "ids.shape"), const("one", np.array(1, np.int64))], "seq")
    seq1 = node("Unsqueeze", [seq, const("axis0", np.array([0], np.int64))], "seq1")
    zero1 = const("zero1", np.array([0], np.int64))
    pos = node("Slice", [const("emb.pos", _init(rng, (512, hidden), 0.02)), zero1, seq1, zero1], "emb.p")
    h = layer_norm(node("Add", [node("Add", [word, kind], "emb.wt"), pos], "emb.sum"), "emb.ln")
    mask = node("Cast", ["attention_mask"], "mask.f", to=TensorProto.FLOAT)
    inverted = node("Sub", [const("onef", np.array(1.0, np.float32)), mask], "mask.inv")
    lowest = const("lowest", np.array(np.finfo(np.float32).min, np.float32))
    bias = node(
        "Unsqueeze", [node("Mul", [inverted, lowest], "mask.scaled"), const("axes12", np.array([1, 2], np.int64))], "mask.bias"
    )
    split = const("split.shape", np.array([0, 0, heads, head_dim], np.int64))
    merge = const("merge.shape", np.array([0, 0, hidden], np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    half, root2 = const("half", np.array(0.5, np.float32)), const("root2", np.array(math.sqrt(2.0), np.float32))
    onef = "onef"
    for i in range(layers):
        p = f"l{i}"

        def heads_of(x: str, perm: list[int], tag: str, p: str = p) -> str:
            return node("Transpose", [node("Reshape", [x, split], f"{p}.{tag}.r")], f"{p}.{tag}.t", perm=perm)

        q = heads_of(linear(h, hidden, hidden, f"{p}.q"), [0, 2, 1, 3], "q")
        k = heads_of(linear(h, hidden, hidden, f"{p}.k"), [0, 2, 3, 1], "k")
        v = heads_of(linear(h, hidden, hidden, f"{p}.v"), [0, 2, 1, 3], "v")
        scores = node("Add", [node("Mul", [node("MatMul", [q, k], f"{p}.qk"), scale], f"{p}.qk.s"), bias], f"{p}.scores")
        ctx = node("MatMul", [node("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], f"{p}.ctx.t", perm=[0, 2, 1, 3]), merge], f"{p}.ctx.m")
        h = layer_norm(node("Add", [linear(ctx, hidden, hidden, f"{p}.o"), h], f"{p}.att.sum"), f"{p}.ln1")
        up = linear(h, hidden, ffn, f"{p}.up")
        erf = node("Erf", [node("Div", [up, root2], f"{p}.gelu.d")], f"{p}.gelu.e")
        gelu = node("Mul", [node("Mul", [up, node("Add", [erf, onef], f"{p}.gelu.a")], f"{p}.gelu.m"), half], f"{p}.gelu")
        h = layer_norm(node("Add", [linear(gelu, ffn, hidden, f"{p}.down"), h], f"{p}.ffn.sum"), f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    first = node("Gather", [h, const("zero", np.array(0, np.int64))], "cls", axis=1)
    node("Tanh", [linear(first, hidden, hidden, "pool")], "pooler_output")
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "S", hidden]),
        helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["B", hidden]),
    ]
    graph = helper.make_graph(nodes, "bert_base", ints, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="gpu_check")


def _export(module, args: tuple, input_names: list[str], output_names: list[str], dynamic: dict) -> onnx.ModelProto:
    import torch

    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            buffer,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    return onnx.load_from_string(buffer.getvalue())


def torch_resnet50() -> onnx.ModelProto:
    import torch
    import torchvision

    torch.manual_seed(0)
    module = torchvision.models.resnet50(weights=None).eval()
    return _export(module, (torch.randn(1, 3, 224, 224),), ["input"], ["logits"], {"input": {0: "N"}, "logits": {0: "N"}})


def torch_bert_base() -> onnx.ModelProto:
    import torch
    import transformers

    class ByName(torch.nn.Module):
        """BertModel called by keyword (its positional order differs between transformers releases), as a tuple."""

        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    torch.manual_seed(0)
    config = transformers.BertConfig(attn_implementation="eager")  # (bert-base sizes; eager attention exports as MatMul/Softmax)
    module = ByName(transformers.BertModel(config, add_pooling_layer=True).eval())
    ids = torch.ones(1, 16, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dynamic = {n: {0: "B", 1: "S"} for n in names} | {"last_hidden_state": {0: "B", 1: "S"}, "pooler_output": {0: "B"}}
    return _export(module, (ids, ids, torch.zeros_like(ids)), names, ["last_hidden_state", "pooler_output"], dynamic)


def _bert_feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq * 3 // 4 :] = 0  # (padding in every row: the mask's additive bias is exercised)
    return {
        "input_ids": rng.integers(0, 30522, (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, seq), np.int64),
    }


def full_models(names: set[str], builder: str, log: Log) -> Iterator[tuple[str, str, Callable[[], onnx.ModelProto], dict]]:
    """(name, how it is built, build, feeds) of the full-size latency models: torch's export where
    ``builder`` allows it and the packages import, else the onnx.helper graphs above."""
    specs = {
        "resnet50": (
            "torchvision",
            torch_resnet50,
            build_resnet50,
            lambda: {"input": _init(np.random.default_rng(0), (32, 3, 224, 224), 1.0)},
        ),
        "bert": ("transformers", torch_bert_base, build_bert_base, lambda: _bert_feeds(8, 128)),
    }
    for name, (package, exported, built, feeds) in specs.items():
        if name not in names:
            continue
        how = "onnx.helper"
        if builder in ("auto", "torch"):
            try:
                __import__("torch")
                __import__(package)
                how = f"torch.onnx.export ({package})"
            except ImportError as e:
                log(f"  {name}: torch/{package} not importable ({e.name}): built with onnx.helper instead")
        yield name, how, (exported if how != "onnx.helper" else built), feeds()


# ---------------------------------------------------------------- latency


def _timed(
    model: onnx.ModelProto, device: str, feeds: dict[str, np.ndarray], warmup: int, iterations: int
) -> tuple[list[float], dict]:
    """Per-run seconds of ``iterations`` IO-bound runs after ``warmup``, and the outputs (on the host)."""
    sess = _session(model, device)
    binding = sess.io_binding()
    where = "cuda" if device == "cuda" else "cpu"
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, where, 0))
    names = [o.name for o in sess.get_outputs()]
    for name in names:
        binding.bind_output(name, where)
    for _ in range(warmup):
        sess.run_with_iobinding(binding)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        sess.run_with_iobinding(binding)  # (synchronises the provider's stream before it returns)
        times.append(time.perf_counter() - t)
    return times, dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))


def _converters(have_occ: str | None) -> list[tuple[str, Callable[[onnx.ModelProto], onnx.ModelProto] | None, str]]:
    def occ(m: onnx.ModelProto) -> onnx.ModelProto:
        from onnxconverter_common import float16

        return float16.convert_float_to_float16(m, keep_io_types=True)

    def ort_f16(m: onnx.ModelProto) -> onnx.ModelProto:
        from onnxruntime.transformers.onnx_model import OnnxModel

        copy = onnx.ModelProto()
        copy.CopyFrom(m)  # (it converts in place)
        wrapped = OnnxModel(copy)
        wrapped.convert_float_to_float16(keep_io_types=True)
        return wrapped.model

    out: list = [("fp32", lambda m: m, "")]
    out += [(f"amp-convert {level} fp16", lambda m, level=level: _amp(m, level, "fp16"), "") for level in LEVELS]
    out.append(("onnxconverter-common fp16", occ if have_occ is None else None, have_occ or ""))
    out.append(("onnxruntime float16", ort_f16, ""))
    return out


def section_latency(log: Log, device: str, entries: list[dict], args, deadline: Deadline) -> dict:
    mode = args.latency_models if args.latency_models != "auto" else ("full" if device == "cuda" else "zoo")
    log(f"== latency: {device}, IO binding, median of {args.iterations} runs after {args.warmup} warm-up runs ({mode} models)")
    try:
        import onnxconverter_common  # noqa: F401

        have_occ = None
    except ImportError as e:
        have_occ = f"skipped: onnxconverter-common not importable ({e.name})"
    rows: list[dict] = []
    skipped: list[str] = []
    notes: list[str] = []
    models: list[tuple[str, str, Callable[[], onnx.ModelProto], dict]] = []
    if mode == "full":
        wanted = {e["name"] for e in entries} & set(LATENCY_ZOO_DEFAULT) if args.only else set(LATENCY_ZOO_DEFAULT)
        models = list(full_models(wanted, args.builder, log))
    else:
        only = {e["name"] for e in entries} if args.only else set(LATENCY_ZOO_DEFAULT)
        for e in entries:
            if e["name"] in only:
                models.append((e["name"], "zoo (reduced)", lambda e=e: onnx.load(e["path"]), make_inputs(e, seed=0)))
        notes.append("the zoo's reduced models at the manifest's shapes, not full-size ResNet-50 / BERT-base")
    for note in notes:
        log(f"  note: {note}")
    for name, how, build, feeds in models:
        if deadline.left() <= 0:
            skipped.append(f"{name}: over the section's budget")
            continue
        shape = " ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in feeds.items())
        t = time.perf_counter()
        try:
            model = build()
        except Exception as e:
            if how.startswith("torch"):  # (an export that fails falls back to the helper-built graph)
                log(f"  {name}: export failed ({_first_line(e)}): built with onnx.helper instead")
                how, model = "onnx.helper", (build_resnet50 if name == "resnet50" else build_bert_base)()
            else:
                rows.append({"model": name, "built": how, "variant": "fp32", "error": f"build: {_first_line(e)}"})
                continue
        log(f"  {name}: {how}, {len(model.graph.node)} nodes, built in {time.perf_counter() - t:.1f} s, inputs {shape}")
        base, ref = None, None
        for label, fn, why in _converters(have_occ):
            row: dict[str, Any] = {"model": name, "built": how, "inputs": shape, "variant": label}
            if fn is None:
                rows.append(row | {"error": why})
                continue
            if deadline.left() <= 0:
                skipped.append(f"{name} {label}: over the section's budget")
                continue
            try:
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    converted = fn(model)
                row["convert_s"] = round(time.perf_counter() - t, 3)
                times, outs = _timed(converted, device, feeds, args.warmup, args.iterations)
            except Exception as e:
                rows.append(row | {"error": _first_line(e)})
                continue
            median = statistics.median(times) * 1e3
            row |= {"median_ms": median, "min_ms": min(times) * 1e3, "runs": len(times)}
            if label == "fp32":
                base, ref = median, outs
            elif ref is not None:
                row["max_rel_err_vs_fp32"], row["cosine_vs_fp32"] = _against_fp32(ref, outs)
            row["vs_fp32"] = _ratio(median, base)
            rows.append(row)
    header = ["model", "variant", "median ms", "min ms", "vs fp32", "convert s", "max rel err vs fp32", "cos vs fp32", "note"]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], r["variant"], "-", "-", "-", "-", "-", "-", r["error"][:120]])
            continue
        table.append(
            [
                r["model"],
                r["variant"],
                _num(r["median_ms"], ".3f"),
                _num(r["min_ms"], ".3f"),
                _num(r["vs_fp32"], ".2f") + ("x" if r["vs_fp32"] is not None else ""),
                _num(r["convert_s"], ".2f"),
                _num(r.get("max_rel_err_vs_fp32")),
                _num(r.get("cosine_vs_fp32"), ".6f"),
                "",
            ]
        )
    log.table(header, table, args.markdown)
    for line in skipped:
        log(f"  skipped {line}")
    return {"device": device, "models": mode, "notes": notes, "rows": rows, "skipped": skipped}


def _against_fp32(ref: dict, outs: dict) -> tuple[float | None, float | None]:
    """Worst max rel error and lowest cosine of the float outputs against the fp32 variant's (inf / None
    where the variant made NaN or Inf the fp32 run did not)."""
    worst, lowest = 0.0, 1.0
    for name, r in ref.items():
        if name not in outs or r.dtype.kind != "f" or r.shape != outs[name].shape:
            continue
        stats = ErrorStats(name)
        stats.update(r, outs[name])
        if stats.new_nonfinite:
            return math.inf, None
        worst, lowest = max(worst, stats.max_rel_err), min(lowest, stats.cosine)
    return worst, lowest


# ---------------------------------------------------------------- main


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default=os.environ.get("OUT") or "gpu_check_out", help="output folder (default $OUT, else ./gpu_check_out)"
    )
    parser.add_argument("--cpu", action="store_true", help="the CPU path even where CUDA runs")
    parser.add_argument("--only", default="", help="comma-separated zoo model names (all sections)")
    parser.add_argument("--iterations", type=int, default=None, help="timed runs per variant (default 50 on CUDA, 5 on CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up runs per variant (default 10 on CUDA, 2 on CPU)")
    parser.add_argument(
        "--latency-models", choices=["auto", "full", "zoo"], default="auto", help="auto: full on CUDA, zoo on CPU"
    )
    parser.add_argument("--builder", choices=["auto", "torch", "onnx"], default="auto", help="how full-size models are made")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run (sections are skipped past it)")
    parser.add_argument("--fidelity-budget", type=float, default=200.0)
    parser.add_argument(
        "--registry-python", default="", help="another interpreter to read the registry with, where this one's crashes"
    )
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: registry, fidelity, latency")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    args = parser.parse_args(argv)
    if (args.iterations is not None and args.iterations < 1) or (args.warmup is not None and args.warmup < 0):
        parser.error("--iterations must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    cap = started + args.budget
    log = Log()
    available = ort.get_available_providers()
    usable, why = cuda_usable() if CUDA in available else (False, "this onnxruntime build has no CUDA provider")
    device = "cuda" if usable and not args.cpu else "cpu"
    if device == "cuda":
        log(f"CUDA path ({why})")
    elif usable:
        log("CPU path (--cpu; CUDA is available)")
    else:
        log(f"CUDA not available: CPU path ({why})")
    args.iterations = args.iterations or (50 if device == "cuda" else 5)
    args.warmup = args.warmup if args.warmup is not None else (10 if device == "cuda" else 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "device": device,
        "cuda_note": why,
        "available_providers": available,
        "python": sys.version.split()[0],
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "host": platform.node(),
        "commit": _commit(),
    }
    log(f"onnxruntime {ort.__version__} providers: {', '.join(available)}")
    log(f"python {meta['python']}, onnx {onnx.__version__}, numpy {np.__version__}, commit {meta['commit']}, out {out}")
    only = [n for n in args.only.split(",") if n]
    entries = load_manifest(str(ROOT / "models" / "zoo" / "manifest.json"))
    unknown = sorted(set(only) - {e["name"] for e in entries})
    if unknown:
        log(f"unknown --only names: {', '.join(unknown)}")
        return 2
    entries = [e for e in entries if not only or e["name"] in only]
    skip = {s for s in args.skip.split(",") if s}
    doc: dict[str, Any] = {"meta": meta}
    dtypes = ("fp16", "bf16") if device == "cuda" else ("fp16",)
    sections: list[tuple[str, Callable[[], dict]]] = [
        ("registry", lambda: section_registry(log, device == "cuda", out, args, Deadline(kernels.LIVE_TIMEOUT_S, cap))),
        ("fidelity", lambda: section_fidelity(log, device, entries, dtypes, args, Deadline(args.fidelity_budget, cap))),
        ("latency", lambda: section_latency(log, device, entries, args, Deadline(args.budget, cap))),
    ]
    for name, run in sections:
        t = time.monotonic()
        if name in skip:
            log(f"== {name}: skipped (--skip)")
            doc[name] = {"skipped": "--skip"}
        elif cap - t <= 0:
            log(f"== {name}: skipped, the run's budget of {args.budget:.0f} s is spent")
            doc[name] = {"skipped": "over budget"}
        else:
            try:
                doc[name] = run()
            except Exception as e:  # (one section's breakage is reported, the others still run)
                log(f"== {name} failed: {_first_line(e)}")
                doc[name] = {"error": traceback.format_exc()}
        doc[name]["seconds"] = round(time.monotonic() - t, 2)
        log(f"   ({name}: {doc[name]['seconds']:.1f} s)")
    doc["seconds"] = round(time.monotonic() - started, 2)
    log(f"done in {doc['seconds']:.1f} s; JSON: {out / 'gpu_check.json'}")
    doc["printed"] = log.lines
    (out / "gpu_check.json").write_text(json.dumps(_jsonable(doc), indent=1) + "\n")
    return 0


def _commit() -> str:
    try:
        run = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return run.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
