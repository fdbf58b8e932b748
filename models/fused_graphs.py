"""Small hand-built graphs around onnxruntime's com.microsoft ops that its
transformer optimizer does not produce from the ORT zoo's models:
GroupQueryAttention (with a key/value cache), MultiHeadAttention,
RotaryEmbedding and MatMulNBits (a real 4-bit block-quantized weight).

Each graph is fp32 with random initializers from a fixed seed, has float
MatMuls around the fused op (weights for a converter to lower), and loads
and runs in onnxruntime's CPU provider. ``GRAPHS`` maps a name to its
(model builder, feeds builder); a builder's defaults are the sizes the tests
use, and the feeds match the model built with the same arguments:

    from models.fused_graphs import GRAPHS
    build, feeds = GRAPHS["gqa"]
    model, inputs = build(), feeds()

numpy and onnx only (no onnxruntime import), so any venv can build them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "GRAPHS",
    "dequantize_4bit",
    "gqa_feeds",
    "gqa_model",
    "matmul_nbits_feeds",
    "matmul_nbits_model",
    "mha_feeds",
    "mha_model",
    "quantize_4bit",
    "rotary_feeds",
    "rotary_model",
]

MS = "com.microsoft"
OPSET = 17
IR_VERSION = 8
SEED = 0
F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def _rng(tag: str) -> np.random.Generator:
    # One stream per graph and purpose, independent of build order.
    return np.random.default_rng([SEED, *tag.encode()])


def _weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A projection weight with unit-variance outputs for unit-variance inputs."""
    return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)


def _rope_caches(max_positions: int, head_size: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (max_positions, head_size / 2) of rotary embeddings, base 10000."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size))
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray],
    doc: str,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
        producer_name="amp-convert fused_graphs",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    return model


# --------------------------------------------------------------------------- GroupQueryAttention


def gqa_model(
    seq: int = 4, past: int = 12, hidden: int = 64, heads: int = 4, kv_heads: int = 2, max_positions: int = 64
) -> onnx.ModelProto:
    """x [1, seq, hidden] -> q/k/v MatMuls -> GroupQueryAttention (do_rotary with cos/sin caches,
    past_key/past_value [1, kv_heads, past, head] in, present_key/present_value out, seqlens_k,
    total_sequence_length) -> output MatMul -> y [1, seq, hidden]."""
    head = hidden // heads
    rng = _rng("gqa")
    cos, sin = _rope_caches(max_positions, head)
    inits = {
        "Wq": _weight(rng, hidden, heads * head),
        "Wk": _weight(rng, hidden, kv_heads * head),
        "Wv": _weight(rng, hidden, kv_heads * head),
        "Wo": _weight(rng, heads * head, hidden),
        "cos_cache": cos,
        "sin_cache": sin,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
            ["attn", "present_key", "present_value"],
            name="gqa",
            domain=MS,
            num_heads=heads,
            kv_num_heads=kv_heads,
            do_rotary=1,
        ),
        helper.make_node("MatMul", ["attn", "Wo"], ["y"], name="o_proj"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F32, [1, seq, hidden]),
        helper.make_tensor_value_info("past_key", F32, [1, kv_heads, past, head]),
        helper.make_tensor_value_info("past_value", F32, [1, kv_heads, past, head]),
        helper.make_tensor_value_info("seqlens_k", I32, [1]),
        helper.make_tensor_value_info("total_sequence_length", I32, []),
    ]
    outputs = [
        helper.make_tensor_value_info("y", F32, [1, seq, hidden]),
        # (symbolic: onnxruntime's shape inference takes present for the past buffer, shared or not)
        helper.make_tensor_value_info("present_key", F32, [1, kv_heads, "total_sequence_length", head]),
        helper.make_tensor_value_info("present_value", F32, [1, kv_heads, "total_sequence_length", head]),
    ]
    doc = f"GroupQueryAttention {heads} heads / {kv_heads} kv heads, {seq} new tokens after {past} cached, rotary inside"
    return _model("gqa", nodes, inputs, outputs, inits, doc)


def gqa_feeds(
    seq: int = 4, past: int = 12, hidden: int = 64, heads: int = 4, kv_heads: int = 2, max_positions: int = 64
) -> dict[str, np.ndarray]:
    """Inputs of :func:`gqa_model` with the same arguments: one sequence, its cache full (seqlens_k = total - 1)."""
    head = hidden // heads
    rng = _rng("gqa feeds")
    total = past + seq
    if total > max_positions:
        raise ValueError(f"past + seq = {total} exceeds the rotary caches' {max_positions} positions")
    return {
        "x": rng.uniform(-1, 1, (1, seq, hidden)).astype(np.float32),
        "past_key": rng.uniform(-1, 1, (1, kv_heads, past, head)).astype(np.float32),
        "past_value": rng.uniform(-1, 1, (1, kv_heads, past, head)).astype(np.float32),
        "seqlens_k": np.array([total - 1], np.int32),
        "total_sequence_length": np.array(total, np.int32),
    }


# --------------------------------------------------------------------------- MultiHeadAttention


def mha_model(seq: int = 6, kv_seq: int = 10, hidden: int = 64, heads: int = 4) -> onnx.ModelProto:
    """Cross attention: x [1, seq, hidden] (queries) and memory [1, kv_seq, hidden] (keys, values)
    -> q/k/v MatMuls -> MultiHeadAttention (packed q/k/v bias, int32 key_padding_mask [1, kv_seq])
    -> output MatMul -> y [1, seq, hidden]."""
    rng = _rng("mha")
    inits = {
        "Wq": _weight(rng, hidden, hidden),
        "Wk": _weight(rng, hidden, hidden),
        "Wv": _weight(rng, hidden, hidden),
        "Wo": _weight(rng, hidden, hidden),
        "qkv_bias": (0.02 * rng.standard_normal(3 * hidden)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["memory", "Wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["memory", "Wv"], ["v"], name="v_proj"),
        helper.make_node(
            "MultiHeadAttention",
            ["q", "k", "v", "qkv_bias", "key_padding_mask"],
            ["attn"],
            name="mha",
            domain=MS,
            num_heads=heads,
        ),
        helper.make_node("MatMul", ["attn", "Wo"], ["y"], name="o_proj"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F32, [1, seq, hidden]),
        helper.make_tensor_value_info("memory", F32, [1, kv_seq, hidden]),
        helper.make_tensor_value_info("key_padding_mask", I32, [1, kv_seq]),
    ]
    outputs = [helper.make_tensor_value_info("y", F32, [1, seq, hidden])]
    return _model("mha", nodes, inputs, outputs, inits, f"MultiHeadAttention {heads} heads, {seq} queries over {kv_seq} keys")


def mha_feeds(seq: int = 6, kv_seq: int = 10, hidden: int = 64, heads: int = 4) -> dict[str, np.ndarray]:
    """Inputs of :func:`mha_model`: the last two memory positions are padding (mask 0)."""
    rng = _rng("mha feeds")
    mask = np.ones((1, kv_seq), np.int32)
    mask[:, -2:] = 0
    return {
        "x": rng.uniform(-1, 1, (1, seq, hidden)).astype(np.float32),
        "memory": rng.uniform(-1, 1, (1, kv_seq, hidden)).astype(np.float32),
        "key_padding_mask": mask,
    }


# --------------------------------------------------------------------------- RotaryEmbedding


def rotary_model(seq: int = 8, hidden: int = 64, heads: int = 4, max_positions: int = 64) -> onnx.ModelProto:
    """x [1, seq, hidden] -> MatMul -> RotaryEmbedding (position_ids [1, seq] int64, cos/sin caches
    [max_positions, head / 2]) -> MatMul -> y [1, seq, hidden]."""
    head = hidden // heads
    rng = _rng("rotary")
    cos, sin = _rope_caches(max_positions, head)
    inits = {"Wq": _weight(rng, hidden, hidden), "Wo": _weight(rng, hidden, hidden), "cos_cache": cos, "sin_cache": sin}
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("RotaryEmbedding", ["q", "position_ids", "cos_cache", "sin_cache"], ["q_rot"], name="rotary", domain=MS),
        helper.make_node("MatMul", ["q_rot", "Wo"], ["y"], name="o_proj"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F32, [1, seq, hidden]),
        helper.make_tensor_value_info("position_ids", I64, [1, seq]),
    ]
    outputs = [helper.make_tensor_value_info("y", F32, [1, seq, hidden])]
    return _model("rotary", nodes, inputs, outputs, inits, f"RotaryEmbedding over {heads} heads of {head}")


def rotary_feeds(seq: int = 8, hidden: int = 64, heads: int = 4, max_positions: int = 64) -> dict[str, np.ndarray]:
    """Inputs of :func:`rotary_model`: positions counting up from 5 (a step after a prompt)."""
    rng = _rng("rotary feeds")
    start = 5
    if start + seq > max_positions:
        raise ValueError(f"positions up to {start + seq} exceed the caches' {max_positions}")
    return {
        "x": rng.uniform(-1, 1, (1, seq, hidden)).astype(np.float32),
        "position_ids": np.arange(start, start + seq, dtype=np.int64)[None, :],
    }


# --------------------------------------------------------------------------- MatMulNBits


def quantize_4bit(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric 4-bit block quantization of ``weight`` [K, N] along K, in MatMulNBits' layout.

    Returns (B, scales, zero_points): B uint8 [N, k_blocks, block_size / 2], two values a byte,
    the first in the low nibble; scales float32 [N, k_blocks]; zero_points uint8 [N, ceil(k_blocks / 2)],
    packed the same way. K must be a multiple of ``block_size``.
    """
    k, n = weight.shape
    if k % block_size or block_size % 2:
        raise ValueError(f"K={k} must be a multiple of an even block_size={block_size}")
    blocks = k // block_size
    w = weight.T.reshape(n, blocks, block_size).astype(np.float64)
    low = np.minimum(w.min(axis=2), 0.0)
    high = np.maximum(w.max(axis=2), 0.0)
    scales = np.where(high > low, (high - low) / 15.0, 1.0)
    zero = np.clip(np.round(-low / scales), 0, 15).astype(np.uint8)
    q = np.clip(np.round(w / scales[..., None]) + zero[..., None], 0, 15).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    if blocks % 2:
        zero = np.concatenate([zero, np.zeros((n, 1), np.uint8)], axis=1)
    zero_packed = (zero[:, 0::2] | (zero[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales.astype(np.float32), zero_packed


def dequantize_4bit(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int) -> np.ndarray:
    """The [K, N] float32 weight that MatMulNBits computes with (inverse of :func:`quantize_4bit`'s layout)."""
    n, blocks, _ = packed.shape
    q = np.empty((n, blocks, 2 * packed.shape[2]), np.float32)
    q[..., 0::2] = packed & 0x0F
    q[..., 1::2] = packed >> 4
    zero = np.empty((n, 2 * zero_points.shape[1]), np.float32)
    zero[:, 0::2] = zero_points & 0x0F
    zero[:, 1::2] = zero_points >> 4
    w = (q - zero[:, :blocks, None]) * scales[..., None]
    return w.reshape(n, -1)[:, :k].T.astype(np.float32)


def matmul_nbits_model(rows: int = 4, k: int = 64, n: int = 48, m: int = 32, block_size: int = 32) -> onnx.ModelProto:
    """x [rows, k] -> MatMulNBits (a random [k, n] weight quantized to 4 bits, blocks of ``block_size``,
    packed uint8 zero points) -> Relu -> float MatMul [n, m] -> y [rows, m]."""
    rng = _rng("nbits")
    packed, scales, zero_points = quantize_4bit(_weight(rng, k, n), block_size)
    inits = {"B_q4": packed, "B_scales": scales, "B_zero_points": zero_points, "W2": _weight(rng, n, m)}
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["x", "B_q4", "B_scales", "B_zero_points"],
            ["h"],
            name="q4_matmul",
            domain=MS,
            K=k,
            N=n,
            bits=4,
            block_size=block_size,
        ),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="out_proj"),
    ]
    inputs = [helper.make_tensor_value_info("x", F32, [rows, k])]
    outputs = [helper.make_tensor_value_info("y", F32, [rows, m])]
    return _model("matmul_nbits", nodes, inputs, outputs, inits, f"MatMulNBits 4-bit [{k}, {n}], block {block_size}")


def matmul_nbits_feeds(rows: int = 4, k: int = 64, n: int = 48, m: int = 32, block_size: int = 32) -> dict[str, np.ndarray]:
    """Inputs of :func:`matmul_nbits_model`."""
    return {"x": _rng("nbits feeds").uniform(-1, 1, (rows, k)).astype(np.float32)}


GRAPHS: dict[str, tuple[Callable[..., onnx.ModelProto], Callable[..., dict[str, np.ndarray]]]] = {
    "gqa": (gqa_model, gqa_feeds),
    "mha": (mha_model, mha_feeds),
    "rotary": (rotary_model, rotary_feeds),
    "matmul_nbits": (matmul_nbits_model, matmul_nbits_feeds),
}
