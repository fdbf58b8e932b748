"""Build the ONNX test/benchmark model zoo (random weights, deterministic).

Run with the export venv (torch, torchvision, transformers, onnx, onnxscript,
onnxruntime):

    .venv-zoo/bin/python models/build_zoo.py                 # reduced -> models/zoo/
    .venv-zoo/bin/python models/build_zoo.py --full          # full    -> models/cache/full/
    .venv-zoo/bin/python models/build_zoo.py --only vit,bert # subset (manifest is merged)

Each model is exported, its IR version capped at 10, saved with the weights
inside the .onnx, checked with onnx.checker (full_check) and run in
onnxruntime (CPU) on the manifest inputs (outputs must be finite).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision
from torch import nn
from zoo_inputs import iter_nodes, make_inputs

MAX_IR_VERSION = 10
REDUCED_MODEL_LIMIT = 4 * 1024 * 1024
REDUCED_TOTAL_LIMIT = 20 * 1024 * 1024


@dataclass
class Built:
    module: nn.Module
    inputs: list[dict[str, Any]]  # manifest input specs (concrete shapes)
    outputs: list[str]
    source: str
    exporter: str = "torchscript"  # "torchscript" (dynamo=False) or "dynamo"
    opset: int = 17
    dynamic_axes: dict[str, dict[int, str]] | None = None
    keep_batchnorm: bool = False  # torchscript: TrainingMode.PRESERVE keeps BN nodes
    alt_inputs: list[dict[str, Any]] | None = None  # other concrete shapes that must also run
    compare_tol: float | None = 1e-3  # max |onnxruntime - torch| (relative to output scale)
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def randomize_batchnorm(model: nn.Module, seed: int = 1234) -> None:
    """Non-trivial BN statistics/affine params so BN is not an identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.05)


def to_torch(entry_inputs: list[dict[str, Any]], name: str) -> tuple[torch.Tensor, ...]:
    feeds = make_inputs({"name": name, "inputs": entry_inputs}, seed=0)
    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[s["name"]])) for s in entry_inputs)


def fspec(name: str, shape: list[int], low: float = -1.0, high: float = 1.0) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(shape),
        "dtype": "float32",
        "low": low,
        "high": high,
    }


def ispec(name: str, shape: list[int], low: int, high: int, value: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "shape": list(shape),
        "dtype": "int64",
        "low": low,
        "high": high,
    }
    if value is not None:
        d["value"] = value
    return d


# --------------------------------------------------------------------------- builders


def build_resnet50(full: bool) -> Built:
    from torchvision.models.resnet import Bottleneck, ResNet

    if full:
        m = torchvision.models.resnet50(weights=None)
        hw, src = (
            224,
            "torchvision resnet50 (Bottleneck,[3,4,6,3]), random weights, seed 0",
        )
    else:

        class SlimBottleneck(Bottleneck):
            # Same 1x1 -> 3x3 -> 1x1 (+downsample) block, 4x narrower overall:
            # width = planes/4 (width_per_group=16), out = planes (expansion 1).
            expansion = 1

        m = ResNet(SlimBottleneck, [1, 1, 1, 1], num_classes=100, width_per_group=16)
        hw = 64
        src = (
            "torchvision ResNet(Bottleneck subclass expansion=1, [1,1,1,1], width_per_group=16, "
            "num_classes=100) reduced, random weights, seed 0"
        )
    randomize_batchnorm(m)
    return Built(
        m,
        [fspec("input", [1, 3, hw, hw])],
        ["logits"],
        src + "; BatchNormalization kept (TrainingMode.PRESERVE in eval mode)",
        keep_batchnorm=True,
    )


def build_mobilenetv3(full: bool) -> Built:
    if full:
        m = torchvision.models.mobilenet_v3_large(weights=None)
        hw, src = 224, "torchvision mobilenet_v3_large, random weights, seed 0"
    else:
        m = torchvision.models.mobilenet_v3_large(weights=None, width_mult=0.35, num_classes=100)
        hw, src = (
            64,
            "torchvision mobilenet_v3_large(width_mult=0.35, num_classes=100) reduced, random weights, seed 0",
        )
    randomize_batchnorm(m)
    with torch.no_grad():  # default head init is N(0, 0.01): make logits less tiny
        for mod in m.classifier.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=1.0 / mod.in_features**0.5)
    return Built(m, [fspec("input", [1, 3, hw, hw])], ["logits"], src)


def build_vit(full: bool) -> Built:
    from torchvision.models.vision_transformer import VisionTransformer

    if full:
        m = torchvision.models.vit_b_16(weights=None)
        hw, src = 224, "torchvision vit_b_16, random weights, seed 0, dynamo exporter"
    else:
        m = VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
            num_classes=10,
        )
        hw = 32
        src = (
            "torchvision VisionTransformer(image 32, patch 8, 2 layers, 2 heads, hidden 32, mlp 64, "
            "10 classes) reduced, random weights, seed 0, dynamo exporter"
        )
    with torch.no_grad():  # torchvision zero-inits the classification head
        nn.init.normal_(m.heads.head.weight, std=1.0 / m.heads.head.in_features**0.5)
        nn.init.normal_(m.heads.head.bias, std=0.02)
    return Built(
        m,
        [fspec("input", [1, 3, hw, hw])],
        ["logits"],
        src,
        exporter="dynamo",
        opset=18,
    )


def build_convnext(full: bool) -> Built:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if full:
        m = torchvision.models.convnext_tiny(weights=None, layer_scale=0.1)
        hw, src = (
            224,
            "torchvision convnext_tiny(layer_scale=0.1), random weights, seed 0",
        )
    else:
        setting = [
            CNBlockConfig(16, 32, 1),
            CNBlockConfig(32, 64, 1),
            CNBlockConfig(64, 128, 2),
            CNBlockConfig(128, None, 1),
        ]
        m = ConvNeXt(setting, stochastic_depth_prob=0.0, layer_scale=0.1, num_classes=100)
        hw = 64
        src = (
            "torchvision ConvNeXt(block_setting dims 16/32/64/128, depths 1/1/2/1, layer_scale=0.1, "
            "num_classes=100) reduced, random weights, seed 0"
        )
    with torch.no_grad():  # trunc_normal(0.02) head -> tiny logits; rescale
        head = m.classifier[-1]
        nn.init.normal_(head.weight, std=1.0 / head.in_features**0.5)
    return Built(m, [fspec("input", [1, 3, hw, hw])], ["logits"], src)


class _BertWrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
        )
        return out.last_hidden_state, out.pooler_output


def build_bert(full: bool) -> Built:
    from transformers import BertConfig, BertModel

    if full:
        cfg = BertConfig(attn_implementation="eager")  # bert-base-uncased sizes
        seq, src = (
            128,
            "transformers BertModel, bert-base config (12 layers, hidden 768), random weights, seed 0",
        )
    else:
        cfg = BertConfig(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
        seq = 16
        src = (
            "transformers BertModel(vocab 1000, hidden 64, 2 layers, 2 heads, intermediate 128) reduced, "
            "random weights, seed 0; dynamic batch/sequence axes"
        )
    m = BertModel(cfg, add_pooling_layer=True)
    v = cfg.vocab_size

    def specs(s: int) -> list[dict[str, Any]]:
        return [
            ispec("input_ids", [1, s], 0, v),
            # attention mask: all ones by default (value); low/high allow a random 0/1 mask
            ispec("attention_mask", [1, s], 0, 2, value=1),
            ispec("token_type_ids", [1, s], 0, 2),
        ]

    dyn = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")}
    dyn.update(
        {
            "last_hidden_state": {0: "batch", 1: "sequence"},
            "pooler_output": {0: "batch"},
        }
    )
    return Built(
        _BertWrapper(m),
        specs(seq),
        ["last_hidden_state", "pooler_output"],
        src,
        dynamic_axes=dyn,
        alt_inputs=specs(seq // 2),
    )


class _GPT2Wrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        # An explicit all-ones padding mask keeps transformers on its regular
        # (padding + causal) mask path; without it, it looks for packed
        # sequences with aten::diff, which the TorchScript exporter lacks.
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def build_gpt2(full: bool) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    if full:
        cfg = GPT2Config(use_cache=False, attn_implementation="eager")  # gpt2 124M
        seq, src = (
            128,
            "transformers GPT2LMHeadModel, gpt2 (124M) config, use_cache=False, random weights, seed 0",
        )
    else:
        cfg = GPT2Config(
            vocab_size=1000,
            n_positions=64,
            n_embd=64,
            n_layer=2,
            n_head=2,
            bos_token_id=999,
            eos_token_id=999,
            use_cache=False,
            attn_implementation="eager",
        )
        seq = 16
        src = (
            "transformers GPT2LMHeadModel(vocab 1000, n_embd 64, 2 layers, 2 heads, use_cache=False) reduced, "
            "random weights, seed 0"
        )
    m = GPT2LMHeadModel(cfg)
    return Built(
        _GPT2Wrapper(m),
        [ispec("input_ids", [1, seq], 0, cfg.vocab_size)],
        ["logits"],
        src,
    )


class LSTMClassifier(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int):
        super().__init__()
        self.proj = nn.Linear(n_in, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x):
        y, _ = self.lstm(torch.relu(self.proj(x)))
        return self.head(y)


def build_lstm(full: bool) -> Built:
    if full:
        m, shape, tag = (
            LSTMClassifier(80, 512, 256),
            [1, 200, 80],
            "input 80, hidden 512, seq 200",
        )
    else:
        m, shape, tag = (
            LSTMClassifier(16, 32, 10),
            [1, 20, 16],
            "input 16, hidden 32, seq 20",
        )
    return Built(
        m,
        [fspec("input", shape)],
        ["logits"],
        f"custom Linear -> nn.LSTM(2 layers, batch_first) -> Linear ({tag}), random weights, seed 0",
    )


class _DetectorWrapper(nn.Module):
    """Tensor in / tensors out around a torchvision SSD (one image, batch 1)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images):
        det = self.model([images[0]])[0]
        return det["boxes"], det["scores"], det["labels"]


def build_detector(full: bool) -> Built:
    from functools import partial

    from torchvision.models.detection import ssd as ssd_mod
    from torchvision.models.detection import ssdlite
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator

    if full:
        m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
        hw = 320
        src = "torchvision ssdlite320_mobilenet_v3_large(num_classes=91), random weights, seed 0"
    else:
        # Same recipe as ssdlite320_mobilenet_v3_large, with a narrower backbone,
        # a 128x128 internal size, fewer classes and fewer detections.
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)
        backbone = torchvision.models.mobilenet_v3_large(weights=None, width_mult=0.25, reduced_tail=True, norm_layer=norm)
        backbone = ssdlite._mobilenet_extractor(backbone, 6, norm)
        size = (128, 128)
        anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
        from torchvision.models.detection import _utils as det_utils

        out_channels = det_utils.retrieve_out_channels(backbone, size)
        num_classes = 5
        m = ssd_mod.SSD(
            backbone,
            anchors,
            size,
            num_classes,
            head=ssdlite.SSDLiteHead(out_channels, anchors.num_anchors_per_location(), num_classes, norm),
            score_thresh=0.001,
            nms_thresh=0.55,
            detections_per_img=50,
            topk_candidates=50,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        )
        hw = 96
        src = (
            "torchvision SSD + SSDLiteHead on mobilenet_v3_large(width_mult=0.25, reduced_tail) "
            "(ssdlite320 recipe, internal size 128, 5 classes, 50 dets) reduced, random weights, seed 0"
        )
    # torchvision's N(0, 0.03) detection init (tuned for training with batch
    # statistics) makes eval-mode features collapse to BN biases, giving many
    # tied scores and an NMS order that depends on the runtime; use a
    # variance-preserving init instead.
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
                if mod.bias is not None:
                    nn.init.normal_(mod.bias, std=0.05)
    randomize_batchnorm(m)
    return Built(
        _DetectorWrapper(m),
        [fspec("images", [1, 3, hw, hw], 0.0, 1.0)],
        ["boxes", "scores", "labels"],
        src + "; postprocess (Resize, TopK, batched NMS) in graph",
        compare_tol=1e-3,  # init chosen so scores have no ties: NMS order is stable
    )


class ControlFlowNet(nn.Module):
    """Scripted module: recurrent Loop over time with a nested If, plus a top-level If."""

    def __init__(self, d: int, n_out: int):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.rec = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.gate = nn.Linear(d, d)
        self.pos = nn.Linear(d, d)
        self.neg = nn.Linear(d, d)
        self.head = nn.Linear(d, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, time, d]
        h = torch.zeros(x.size(0), x.size(2), dtype=x.dtype)
        for t in range(x.size(1)):
            xt = x[:, t, :]
            h = torch.tanh(self.inp(xt) + torch.matmul(h, self.rec))
            if bool(xt.mean() > 0.0):
                h = h + torch.relu(self.gate(h)) * 0.5
            else:
                h = h * torch.sigmoid(self.gate(xt))
        if bool(h.sum() > 0.0):
            y = torch.relu(self.pos(h)) + h
        else:
            y = torch.nn.functional.gelu(self.neg(h)) - h
        return self.head(y)


def build_controlflow(full: bool) -> Built:
    if full:
        d, t, n_out = 256, 64, 32
    else:
        d, t, n_out = 32, 8, 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated, still what gives If/Loop
        m = torch.jit.script(ControlFlowNet(d, n_out))
    return Built(
        m,
        [fspec("input", [1, t, d])],
        ["logits"],
        f"torch.jit.script custom module (Loop over dynamic time axis with nested If, top-level If; d={d}, "
        f"time={t}), random weights, seed 0",
        dynamic_axes={"input": {0: "batch", 1: "time"}, "logits": {0: "batch"}},
        alt_inputs=[fspec("input", [2, max(t // 2, 1), d], -1.0, 0.5)],
    )


BUILDERS: dict[str, Callable[[bool], Built]] = {
    "resnet50": build_resnet50,
    "mobilenetv3": build_mobilenetv3,
    "vit": build_vit,
    "convnext": build_convnext,
    "bert": build_bert,
    "gpt2": build_gpt2,
    "lstm": build_lstm,
    "detector": build_detector,
    "controlflow": build_controlflow,
}

NOTABLE_OPS = (
    "If",
    "Loop",
    "Scan",
    "LSTM",
    "GRU",
    "NonMaxSuppression",
    "TopK",
    "Resize",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "Softmax",
    "Erf",
    "Gelu",
    "HardSwish",
    "HardSigmoid",
    "Einsum",
    "Gather",
    "Where",
    "Range",
    "ConstantOfShape",
    "CumSum",
    "Pow",
    "Sqrt",
    "Tanh",
    "Sigmoid",
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "ReduceMean",
    "RoiAlign",
)


# --------------------------------------------------------------------------- export / verify


def op_histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in iter_nodes(model.graph))


def export(built: Built, name: str) -> onnx.ModelProto:
    args = to_torch(built.inputs, name)
    input_names = [s["name"] for s in built.inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if built.exporter == "dynamo":
            prog = torch.onnx.export(
                built.module,
                args,
                dynamo=True,
                opset_version=built.opset,
                input_names=input_names,
                output_names=built.outputs,
                optimize=True,
                verbose=False,
            )
            model = prog.model_proto
        else:
            buf = io.BytesIO()
            torch.onnx.export(
                built.module,
                args,
                buf,
                dynamo=False,
                opset_version=built.opset,
                input_names=input_names,
                output_names=built.outputs,
                dynamic_axes=built.dynamic_axes,
                do_constant_folding=True,
                training=torch.onnx.TrainingMode.PRESERVE if built.keep_batchnorm else torch.onnx.TrainingMode.EVAL,
            )
            model = onnx.load_from_string(buf.getvalue())
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    model.producer_name = "amp-convert build_zoo"
    model.producer_version = f"torch {torch.__version__.split('+')[0]}"
    model.doc_string = built.source
    return model


def torch_reference(built: Built, name: str) -> list[np.ndarray]:
    with torch.no_grad():
        out = built.module(*to_torch(built.inputs, name))
    if isinstance(out, torch.Tensor):
        out = (out,)
    return [o.detach().numpy() for o in out]


def run_ort(path: str, entry: dict[str, Any], seed: int = 0) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, make_inputs(entry, seed=seed))


def check_outputs(name: str, outs: list[np.ndarray]) -> None:
    for i, o in enumerate(outs):
        if np.issubdtype(o.dtype, np.floating):
            if not np.all(np.isfinite(o)):
                raise RuntimeError(f"{name}: output {i} has non-finite values")
            if o.size and float(np.abs(o).max()) == 0.0:
                raise RuntimeError(f"{name}: output {i} is all zeros")


def build_one(name: str, full: bool, out_dir: str) -> dict[str, Any]:
    t0 = time.time()
    seed_all(0)
    built = BUILDERS[name](full)
    built.module.eval()
    model = export(built, name)

    path = os.path.join(out_dir, f"{name}.onnx")
    onnx.save_model(model, path)  # all weights inside (well below 2 GB)
    size = os.path.getsize(path)

    checker_ok, checker_error = True, None
    try:
        onnx.checker.check_model(onnx.load(path), full_check=True)
    except Exception as e:  # keep the model, record the failure
        checker_ok, checker_error = False, f"{type(e).__name__}: {e}"[:500]

    entry: dict[str, Any] = {
        "name": name,
        "file": f"{name}.onnx",
        "source": built.source,
        "exporter": "torch.onnx.export(dynamo=True)" if built.exporter == "dynamo" else "torch.onnx.export(dynamo=False)",
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "ir_version": model.ir_version,
        "inputs": built.inputs,
        "outputs": [o.name for o in model.graph.output],
        "checker_ok": checker_ok,
    }
    if checker_error:
        entry["checker_error"] = checker_error

    outs = run_ort(path, entry)
    check_outputs(name, outs)
    if built.alt_inputs:
        alt = dict(entry, inputs=built.alt_inputs)
        check_outputs(name + " (alt shapes)", run_ort(path, alt))
        entry["alt_inputs"] = built.alt_inputs

    ref = torch_reference(built, name)
    max_diff = None
    if all(r.shape == o.shape for r, o in zip(ref, outs, strict=False)):
        max_diff = 0.0
        for r, o in zip(ref, outs, strict=False):
            if np.issubdtype(r.dtype, np.floating):
                scale = max(1.0, float(np.abs(r).max()))
                max_diff = max(max_diff, float(np.abs(r - o).max()) / scale)
    elif built.compare_tol is not None:
        raise RuntimeError(
            f"{name}: output shapes differ: torch {[r.shape for r in ref]} vs onnxruntime {[o.shape for o in outs]}"
        )
    if built.compare_tol is not None and max_diff is not None and max_diff > built.compare_tol:
        raise RuntimeError(f"{name}: onnxruntime differs from torch by {max_diff:.3g} (relative)")

    hist = op_histogram(model)
    entry["size_bytes"] = size
    entry["node_count"] = sum(hist.values())
    entry["notable_ops"] = [op for op in NOTABLE_OPS if op in hist]
    entry["output_shapes"] = [list(o.shape) for o in outs]
    dt = time.time() - t0
    top = ", ".join(f"{k}:{v}" for k, v in hist.most_common(8))
    print(
        f"[{name}] {size / 1e6:.2f} MB opset {entry['opset']} ir {entry['ir_version']} nodes {entry['node_count']} "
        f"checker_ok={checker_ok} ort-vs-torch={'n/a' if max_diff is None else f'{max_diff:.2e}'} "
        f"({dt:.1f}s)\n    outputs {entry['output_shapes']}\n    top ops: {top}\n    notable: {entry['notable_ops']}",
        flush=True,
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="full-size models into models/cache/full/")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument(
        "--out",
        default=None,
        help="output directory (default: models/zoo or models/cache/full)",
    )
    args = ap.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(BUILDERS)}")
    out_dir = args.out or (os.path.join(HERE, "cache", "full") if args.full else os.path.join(HERE, "zoo"))
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    manifest_path = os.path.join(out_dir, "manifest.json")
    existing: dict[str, dict[str, Any]] = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            existing = {e["name"]: e for e in json.load(f).get("models", [])}

    t0 = time.time()
    failures = []
    for name in names:
        try:
            existing[name] = build_one(name, args.full, out_dir)
        except Exception as e:
            failures.append(name)
            msg = str(e).strip().splitlines()
            print(
                f"[{name}] FAILED: {type(e).__name__}: {msg[0][:500] if msg else ''}",
                flush=True,
            )
            existing.pop(name, None)

    order = list(BUILDERS)
    models = sorted(
        existing.values(),
        key=lambda e: order.index(e["name"]) if e["name"] in order else len(order),
    )
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, indent=1)
        f.write("\n")

    total = sum(os.path.getsize(os.path.join(out_dir, e["file"])) for e in models)
    print(f"wrote {manifest_path}: {len(models)} models, {total / 1e6:.2f} MB total, {time.time() - t0:.0f}s")
    if not args.full and args.out is None:
        big = [e["name"] for e in models if e["size_bytes"] > REDUCED_MODEL_LIMIT]
        if big or total > REDUCED_TOTAL_LIMIT:
            print(f"SIZE BUDGET EXCEEDED: per-model >4MB: {big}; total {total / 1e6:.2f} MB (limit 20 MiB)")
            return 1
    if failures:
        print(f"FAILED: {failures}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
