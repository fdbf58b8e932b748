"""Build the onnxruntime-optimized transformer zoo (random weights, deterministic).

Each model is a small torch module (BERT from a transformers BertConfig; a
GPT-2 with past key/values and a Llama-like decoder written here), exported
with ``torch.onnx.export`` (TorchScript, opset 17) and then run through
onnxruntime's transformer optimizer, ``optimize_model(path, model_type,
num_heads, hidden_size)`` at its command line's default ``opt_level``, which
fuses it into com.microsoft ops (Attention, EmbedLayerNormalization,
SkipLayerNormalization, ...). What is written is the optimized graph.

Run with the ORT zoo venv (CPU torch, transformers, onnx, onnxruntime, sympy):

    make zoo-ort              # reduced (2 layers, hidden 64)  -> models/zoo/ort/
    make zoo-ort-full         # full (4 layers, hidden 256)    -> models/cache/ort/
    .venv-ortzoo/bin/python models/build_ort_zoo.py --only gpt2_past

Every optimized model is run in onnxruntime (CPU) on its manifest inputs and
compared with torch; the fused ops the optimizer produced are printed and
recorded in the manifest (``fused_ops``). A model whose optimizer run lacks
one of the fusions it exists for fails the build.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn
from zoo_inputs import make_inputs

OPSET = 17
DEFAULT_DOMAINS = ("", "ai.onnx")
REDUCED_MODEL_LIMIT = 1024 * 1024  # each reduced model must stay under 1 MiB
COMPARE_TOL = 1e-3  # max |onnxruntime - torch|, relative to the output's scale


@dataclass(frozen=True)
class Size:
    """The dimensions one zoo variant is built at."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    positions: int
    seq: int  # tokens fed in this step
    past: int  # tokens already in the key/value cache (GPT-2)


REDUCED = Size(layers=2, hidden=64, heads=4, vocab=512, positions=128, seq=4, past=12)
FULL = Size(layers=4, hidden=256, heads=4, vocab=8192, positions=512, seq=16, past=48)


@dataclass
class Built:
    module: nn.Module
    inputs: list[dict[str, Any]]  # manifest input specs (concrete shapes)
    outputs: list[str]
    dynamic_axes: dict[str, dict[int, str]]
    source: str
    model_type: str  # onnxruntime.transformers.optimizer model type
    size: Size
    expect_fused: frozenset[str]  # "domain::op" keys the optimizer must produce


def ispec(name: str, shape: list[int], low: int, high: int, value: int | None = None, arange: int | None = None) -> dict:
    spec: dict[str, Any] = {"name": name, "shape": list(shape), "dtype": "int64", "low": low, "high": high}
    if value is not None:
        spec["value"] = value
    if arange is not None:
        spec["arange"] = arange
    return spec


def fspec(name: str, shape: list[int], low: float = -1.0, high: float = 1.0) -> dict:
    return {"name": name, "shape": list(shape), "dtype": "float32", "low": low, "high": high}


# --------------------------------------------------------------------------- BERT (transformers)


class _BertOutputs(nn.Module):
    """Tensors in, (last_hidden_state, pooler_output) out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


def build_bert(size: Size) -> Built:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=4 * size.hidden,
        max_position_embeddings=size.positions,
        attn_implementation="eager",  # the matmul/softmax graph the optimizer fuses into Attention
    )
    seq = 4 * size.seq
    names = ("input_ids", "attention_mask", "token_type_ids")
    dyn = {n: {0: "batch", 1: "sequence"} for n in names}
    dyn.update({"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}})
    return Built(
        _BertOutputs(BertModel(cfg, add_pooling_layer=True)),
        [
            ispec("input_ids", [1, seq], 0, size.vocab),
            ispec("attention_mask", [1, seq], 0, 2, value=1),
            ispec("token_type_ids", [1, seq], 0, 2),
        ],
        ["last_hidden_state", "pooler_output"],
        dyn,
        f"transformers BertModel(vocab {size.vocab}, hidden {size.hidden}, {size.layers} layers, {size.heads} heads, "
        f"intermediate {4 * size.hidden}), random weights, seed 0",
        "bert",
        size,
        frozenset(
            {
                "com.microsoft::EmbedLayerNormalization",
                "com.microsoft::Attention",
                "com.microsoft::SkipLayerNormalization",
                "com.microsoft::BiasGelu",
            }
        ),
    )


# --------------------------------------------------------------------------- GPT-2 with past


class _Conv1D(nn.Module):
    """GPT-2's projection: y = x @ W + b on a 2-D view (addmm), so it exports as Reshape -> Gemm -> Reshape."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.n_out = n_out
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.02)

    def forward(self, x):
        shape = (*x.size()[:-1], self.n_out)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


class _GPT2Attention(nn.Module):
    """Causal self-attention reading one layer's past [2, batch, heads, past, head_size] and
    returning its present (past and this step's key/value, stacked)."""

    def __init__(self, size: Size):
        super().__init__()
        self.hidden, self.heads = size.hidden, size.heads
        self.head_size = size.hidden // size.heads
        tril = torch.tril(torch.ones(size.positions, size.positions, dtype=torch.uint8))
        self.register_buffer("bias", tril.view(1, 1, size.positions, size.positions))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn = _Conv1D(size.hidden, 3 * size.hidden)
        self.c_proj = _Conv1D(size.hidden, size.hidden)

    def _heads(self, x):
        return x.view((*x.size()[:-1], self.heads, self.head_size)).permute(0, 2, 1, 3)

    def forward(self, x, past, mask):
        q, k, v = self.c_attn(x).split(self.hidden, dim=2)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        k = torch.cat((past[0], k), dim=-2)
        v = torch.cat((past[1], v), dim=-2)
        present = torch.stack((k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / (float(v.size(-1)) ** 0.5)
        nd, ns = w.size(-2), w.size(-1)
        causal = self.bias[:, :, ns - nd : ns, :ns]
        w = torch.where(causal.bool(), w, self.masked_bias.to(w.dtype))
        w = nn.functional.softmax(w + mask, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view((*a.size()[:-2], self.hidden))), present


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _GPT2Block(nn.Module):
    def __init__(self, size: Size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(size.hidden)
        self.attn = _GPT2Attention(size)
        self.ln_2 = nn.LayerNorm(size.hidden)
        self.c_fc = _Conv1D(size.hidden, 4 * size.hidden)
        self.c_proj = _Conv1D(4 * size.hidden, size.hidden)

    def forward(self, x, past, mask):
        a, present = self.attn(self.ln_1(x), past, mask)
        x = x + a
        return x + self.c_proj(_gelu_tanh(self.c_fc(self.ln_2(x)))), present


class _GPT2Past(nn.Module):
    """GPT-2 LM decoding step: (input_ids, position_ids, attention_mask, past_0..past_{L-1})
    -> (logits, present_0..present_{L-1}), the interface onnxruntime's GPT-2 tools use."""

    def __init__(self, size: Size):
        super().__init__()
        self.wte = nn.Embedding(size.vocab, size.hidden)
        self.wpe = nn.Embedding(size.positions, size.hidden)
        self.h = nn.ModuleList([_GPT2Block(size) for _ in range(size.layers)])
        self.ln_f = nn.LayerNorm(size.hidden)
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, input_ids, position_ids, attention_mask, *past):
        mask = attention_mask.view(input_ids.size(0), -1)[:, None, None, :].to(torch.float32)
        mask = (1.0 - mask) * -10000.0
        x = self.wte(input_ids) + self.wpe(position_ids)
        presents = []
        for block, layer_past in zip(self.h, past, strict=True):
            x, present = block(x, layer_past, mask)
            presents.append(present)
        logits = torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied LM head
        return (logits, *presents)


def build_gpt2_past(size: Size) -> Built:
    head_size = size.hidden // size.heads
    past_names = [f"past_{i}" for i in range(size.layers)]
    present_names = [f"present_{i}" for i in range(size.layers)]
    total = size.past + size.seq
    dyn: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "position_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total_seq"},
        "logits": {0: "batch", 1: "seq"},
    }
    dyn.update({n: {1: "batch", 3: "past_seq"} for n in past_names})
    dyn.update({n: {1: "batch", 3: "total_seq"} for n in present_names})
    return Built(
        _GPT2Past(size),
        [
            ispec("input_ids", [1, size.seq], 0, size.vocab),
            ispec("position_ids", [1, size.seq], 0, size.positions, arange=size.past),
            ispec("attention_mask", [1, total], 0, 2, value=1),
            *(fspec(n, [2, 1, size.heads, size.past, head_size]) for n in past_names),
        ],
        ["logits", *present_names],
        dyn,
        f"custom GPT-2 decoding step in torch (transformers 4.x GPT2Attention layout: Conv1D/addmm, cached causal "
        f"mask, past [2,B,H,P,D] in, present out; vocab {size.vocab}, hidden {size.hidden}, {size.layers} layers, "
        f"{size.heads} heads, tanh Gelu), random weights, seed 0; {size.seq} new tokens after a past of {size.past}",
        "gpt2",
        size,
        frozenset(
            {
                "com.microsoft::Attention",
                "com.microsoft::SkipLayerNormalization",
                "com.microsoft::FastGelu",
                "com.microsoft::EmbedLayerNormalization",
            }
        ),
    )


# --------------------------------------------------------------------------- Llama-like decoder


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _LlamaAttention(nn.Module):
    """Multi-head attention with rotary position embeddings from cached cos/sin tables."""

    def __init__(self, size: Size):
        super().__init__()
        self.heads, self.head_size, self.hidden = size.heads, size.hidden // size.heads, size.hidden
        self.q_proj = nn.Linear(size.hidden, size.hidden, bias=False)
        self.k_proj = nn.Linear(size.hidden, size.hidden, bias=False)
        self.v_proj = nn.Linear(size.hidden, size.hidden, bias=False)
        self.o_proj = nn.Linear(size.hidden, size.hidden, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_size, 2).float() / self.head_size))
        freqs = torch.outer(torch.arange(size.positions).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x, position_ids, mask):
        b, s, _ = x.size()
        q = self.q_proj(x).view(b, s, self.heads, self.head_size).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_size).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_size).transpose(1, 2)
        seq_len = k.shape[-2]
        cos = self.cos_cached[:seq_len][position_ids].unsqueeze(1)
        sin = self.sin_cached[:seq_len][position_ids].unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_size)
        w = nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, s, self.hidden)
        return self.o_proj(a)


class _LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _LlamaLayer(nn.Module):
    def __init__(self, size: Size):
        super().__init__()
        self.input_layernorm = _RMSNorm(size.hidden)
        self.self_attn = _LlamaAttention(size)
        self.post_attention_layernorm = _RMSNorm(size.hidden)
        self.mlp = _LlamaMLP(size.hidden, _llama_intermediate(size))

    def forward(self, x, position_ids, mask):
        x = x + self.self_attn(self.input_layernorm(x), position_ids, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def _llama_intermediate(size: Size) -> int:
    return 8 * ((8 * size.hidden // 3 + 7) // 8)  # Llama's 8/3 ratio, a multiple of 8


class _Llama(nn.Module):
    """(input_ids, position_ids, attention_mask) -> logits; the mask is built as transformers 4.3x
    LlamaModel builds it (padding mask expanded and filled with finfo.min, plus the causal mask)."""

    def __init__(self, size: Size):
        super().__init__()
        self.embed_tokens = nn.Embedding(size.vocab, size.hidden)
        self.layers = nn.ModuleList([_LlamaLayer(size) for _ in range(size.layers)])
        self.norm = _RMSNorm(size.hidden)
        self.lm_head = nn.Linear(size.hidden, size.vocab, bias=False)

    def forward(self, input_ids, position_ids, attention_mask):
        b, s = input_ids.shape
        low = torch.finfo(torch.float32).min
        causal = torch.full((s, s), low).triu(1)
        inverted = 1.0 - attention_mask[:, None, None, :].expand(b, 1, s, s).to(torch.float32)
        mask = inverted.masked_fill(inverted.to(torch.bool), low) + causal[None, None, :, :]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids, mask)
        return self.lm_head(self.norm(x))


def build_llama(size: Size) -> Built:
    seq = 2 * size.seq
    names = ("input_ids", "position_ids", "attention_mask", "logits")
    return Built(
        _Llama(size),
        [
            ispec("input_ids", [1, seq], 0, size.vocab),
            ispec("position_ids", [1, seq], 0, size.positions, arange=0),
            ispec("attention_mask", [1, seq], 0, 2, value=1),
        ],
        ["logits"],
        {n: {0: "batch", 1: "seq"} for n in names},
        f"custom Llama-like decoder in torch (RMSNorm, rotary embeddings from cached cos/sin, SiLU gated MLP, "
        f"finfo.min attention mask; vocab {size.vocab}, hidden {size.hidden}, {size.layers} layers, {size.heads} heads, "
        f"intermediate {_llama_intermediate(size)}), random weights, seed 0; optimizer model_type qwen3 (its "
        f"decoder-only RoPE/RMSNorm type; gpt2 at its default opt_level 1 fuses only the RMSNorms)",
        "qwen3",
        size,
        frozenset(
            {
                "SimplifiedLayerNormalization",
                "com.microsoft::SkipSimplifiedLayerNormalization",
                "com.microsoft::RotaryEmbedding",
                "com.microsoft::MultiHeadAttention",
            }
        ),
    )


BUILDERS: dict[str, Callable[[Size], Built]] = {
    "bert": build_bert,
    "gpt2_past": build_gpt2_past,
    "llama": build_llama,
}


# --------------------------------------------------------------------------- export / optimize / verify


def fused_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Count of each op outside onnx's standard set: "domain::op", or the bare name for a default-domain
    op onnx does not define (SimplifiedLayerNormalization)."""
    counts: Counter = Counter()
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS:
            counts[f"{node.domain}::{node.op_type}"] += 1
        elif not onnx.defs.has(node.op_type):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def export(built: Built, feeds: dict[str, np.ndarray], path: str) -> None:
    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[s["name"]])) for s in built.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            built.module,
            args,
            path,
            dynamo=False,  # the TorchScript graph is the one the optimizer's patterns match
            opset_version=OPSET,
            input_names=[s["name"] for s in built.inputs],
            output_names=built.outputs,
            dynamic_axes=built.dynamic_axes,
            do_constant_folding=True,
        )


def optimize(raw_path: str, built: Built) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        raw_path,
        model_type=built.model_type,
        num_heads=built.size.heads,
        hidden_size=built.size.hidden,
        opt_level=None,  # the command line's default: the model type's own level
    )
    model = optimized.model
    model.doc_string = built.source
    return model


def default_opt_level(model_type: str) -> int:
    """The opt_level optimize_model (and its command line) takes for ``model_type`` when given none."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    return int(MODEL_TYPES[model_type][2])


def torch_reference(built: Built, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = built.module(*(torch.from_numpy(np.ascontiguousarray(feeds[s["name"]])) for s in built.inputs))
    out = (out,) if isinstance(out, torch.Tensor) else out
    return [o.detach().numpy() for o in out]


def max_relative_diff(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    worst = 0.0
    for r, o in zip(ref, got, strict=True):
        if r.shape != o.shape:
            raise RuntimeError(f"output shape {o.shape} differs from torch's {r.shape}")
        if not np.all(np.isfinite(o)):
            raise RuntimeError("non-finite output")
        scale = max(1.0, float(np.abs(r).max()))
        worst = max(worst, float(np.abs(r.astype(np.float64) - o).max()) / scale)
    return worst


def build_one(name: str, size: Size, out_dir: str) -> dict[str, Any]:
    t0 = time.time()
    torch.manual_seed(0)
    np.random.seed(0)
    built = BUILDERS[name](size)
    built.module.eval()
    entry: dict[str, Any] = {"name": name, "file": f"{name}.onnx", "source": built.source, "inputs": built.inputs}
    feeds = make_inputs(entry, seed=0)

    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, f"{name}.raw.onnx")
        export(built, feeds, raw)
        raw_nodes = len(onnx.load(raw).graph.node)
        model = optimize(raw, built)
    path = os.path.join(out_dir, entry["file"])
    onnx.save_model(model, path)  # weights inside (small)

    checker_ok, checker_error = True, None
    try:
        onnx.checker.check_model(onnx.load(path))  # onnx alone: it may not know onnxruntime's default-domain ops
    except Exception as e:
        checker_ok, checker_error = False, f"{type(e).__name__}: {e}"[:300]

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    outs = session.run(None, feeds)
    diff = max_relative_diff(torch_reference(built, feeds), outs)
    if diff > COMPARE_TOL:
        raise RuntimeError(f"{name}: optimized model differs from torch by {diff:.3g} (relative)")

    fused = fused_ops(model)
    missing = sorted(built.expect_fused - set(fused))
    if missing:
        raise RuntimeError(f"{name}: the optimizer did not produce {missing} (got {fused})")

    entry.update(
        {
            "exporter": "torch.onnx.export(dynamo=False)",
            "optimizer": {
                "tool": f"onnxruntime.transformers.optimizer.optimize_model (onnxruntime {ort.__version__})",
                "model_type": built.model_type,
                "num_heads": size.heads,
                "hidden_size": size.hidden,
                "opt_level": default_opt_level(built.model_type),
            },
            "opset": next(o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS),
            "ir_version": model.ir_version,
            "outputs": [o.name for o in model.graph.output],
            "checker_ok": checker_ok,
        }
    )
    if checker_error:
        entry["checker_error"] = checker_error
    entry["size_bytes"] = os.path.getsize(path)
    entry["node_count"] = len(model.graph.node)
    entry["raw_node_count"] = raw_nodes
    entry["fused_ops"] = fused
    entry["output_shapes"] = [list(o.shape) for o in outs]
    print(
        f"[{name}] {entry['size_bytes'] / 1e6:.2f} MB, {raw_nodes} -> {entry['node_count']} nodes "
        f"(model_type {built.model_type}), ort-vs-torch {diff:.2e}, checker_ok={checker_ok} ({time.time() - t0:.1f}s)\n"
        f"    fused: {', '.join(f'{k} x{v}' for k, v in fused.items())}",
        flush=True,
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="4 layers, hidden 256, into models/cache/ort/")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all); the manifest is merged")
    ap.add_argument("--out", default=None, help="output directory (default: models/zoo/ort or models/cache/ort)")
    args = ap.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(BUILDERS)}")
    out_dir = args.out or os.path.join(HERE, *(("cache", "ort") if args.full else ("zoo", "ort")))
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    # The optimizer logs every pattern it tries; its warnings about symbolic shapes are expected here.
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    for logger_name in ("symbolic_shape_infer", "fusion_base", "onnx_model", "onnx_model_bert", "onnx_model_gpt2"):
        logging.getLogger(logger_name).setLevel(logging.ERROR)

    manifest_path = os.path.join(out_dir, "manifest.json")
    existing: dict[str, dict[str, Any]] = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            existing = {e["name"]: e for e in json.load(f).get("models", [])}

    size = FULL if args.full else REDUCED
    failures = []
    for name in names:
        try:
            existing[name] = build_one(name, size, out_dir)
        except Exception as e:
            failures.append(name)
            print(f"[{name}] FAILED: {type(e).__name__}: {str(e).strip()[:500]}", flush=True)
            existing.pop(name, None)

    order = list(BUILDERS)
    models = sorted(existing.values(), key=lambda e: order.index(e["name"]) if e["name"] in order else len(order))
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, indent=1)
        f.write("\n")
    print(f"wrote {manifest_path}: {len(models)} models")
    if not args.full and args.out is None:
        big = [e["name"] for e in models if e["size_bytes"] > REDUCED_MODEL_LIMIT]
        if big:
            print(f"SIZE BUDGET EXCEEDED: over 1 MiB: {big}")
            return 1
    if failures:
        print(f"FAILED: {failures}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
