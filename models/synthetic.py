"""Synthetic fp32 ONNX graphs for converter benchmarks (numpy + onnx.helper only).

Three builders, all deterministic (fixed seed, byte-for-byte reproducible):

- ``transformer``: pre-LN transformer blocks with a realistic exporter op mix
  (MatMul/Gemm with weight initializers, Add, Mul, Reshape, Transpose,
  Softmax, LayerNormalization and its ReduceMean/Sub/Pow/Sqrt/Div
  decomposition, GELU as Div/Erf/Add/Mul, Shape/Gather/Concat/Unsqueeze on
  int64, a Cast from an int64 mask, Constant nodes, shared initializers).
  Hidden size 16, so a 100k-node graph is only ~18 MB.
- ``conv``: residual conv blocks (Conv, BatchNormalization, Relu, Clip,
  squeeze-excite GlobalAveragePool/HardSigmoid/Mul, depthwise Conv +
  HardSwish), a Shape/Gather/Unsqueeze/Concat/Reshape flatten, Gemm, Softmax.
  8 channels, 3x3 kernels.
- ``big``: an MLP of ``layers`` 4096x4096 fp32 MatMul weights (64 MiB each;
  48 by default = 3 GiB) stored as external data in one ``.data`` file that is
  written tensor by tensor (at most one weight in memory at a time), with
  small inline biases, LayerNormalization and Relu between them.

Models are cached in ``models/cache/synthetic/`` with a ``manifest.json`` in
the zoo's format (``models/zoo_inputs.py`` reads it); a model is rebuilt only
when its file is missing or its manifest entry was made by another builder
version. Every model passes ``onnx.checker`` (full check; by path for the
big one) and the small ones run in onnxruntime (CPU) with finite outputs.

    python models/synthetic.py                          # transformer 2k,10k,40k,100k
    python models/synthetic.py --kinds transformer,conv --sizes 2k,10k
    python models/synthetic.py --big                    # + the 3 GiB external-data model
    python models/synthetic.py --force                  # rebuild even if cached

    from models.synthetic import ensure_model, ensure_big_model
    entry = ensure_model("transformer", 100_000)   # manifest entry, entry["path"]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / "cache" / "synthetic"
MANIFEST = CACHE_DIR / "manifest.json"
BUILDER_VERSION = 1
OPSET = 17
IR_VERSION = 8
SEED = 0

# transformer dimensions
SEQ, HIDDEN, HEADS, FF, VOCAB = 8, 16, 2, 32, 64
HEAD_DIM = HIDDEN // HEADS
# conv dimensions
CHANNELS, SPATIAL, CLASSES = 8, 16, 10


def parse_size(text: str) -> int:
    """'2k' -> 2000, '100k' -> 100000, '1m' -> 1000000, '1500' -> 1500."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1000, t[:-1]
    elif t.endswith("m"):
        mult, t = 1_000_000, t[:-1]
    return int(float(t) * mult)


def size_label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


class GraphBuilder:
    """Accumulates nodes and initializers with unique, torch-exporter-like names."""

    def __init__(self, seed: int = SEED) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._shared: dict[str, str] = {}

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str | list[str]:
        outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def init(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def shared(self, name: str, array: np.ndarray) -> str:
        """An initializer created once and read by many nodes."""
        if name not in self._shared:
            self._shared[name] = self.init(name, array)
        return self._shared[name]

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> str:
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(gain / math.sqrt(fan_in))
        return self.init(name, w.astype(np.float32))

    def vector(self, name: str, n: int, scale: float = 0.02, center: float = 0.0) -> str:
        v = center + self.rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
        return self.init(name, v.astype(np.float32))

    def constant(self, name: str, value: np.ndarray) -> str:
        """A Constant node (as torch.onnx.export emits for literals)."""
        out = f"{name}_output_0"
        self.nodes.append(
            helper.make_node("Constant", [], [out], name=name, value=numpy_helper.from_array(np.asarray(value), f"{name}_value"))
        )
        return out


# --------------------------------------------------------------------------- transformer


def _layer_norm(g: GraphBuilder, x: str, prefix: str, decomposed: bool) -> str:
    gamma = g.vector(f"{prefix}.weight", HIDDEN, 0.02, 1.0)
    beta = g.vector(f"{prefix}.bias", HIDDEN)
    if not decomposed:
        return g.node("LayerNormalization", [x, gamma, beta], f"{prefix}/LayerNormalization", axis=-1, epsilon=1e-5)
    mean = g.node("ReduceMean", [x], f"{prefix}/ReduceMean", axes=[-1], keepdims=1)
    d = g.node("Sub", [x, mean], f"{prefix}/Sub")
    p = g.node("Pow", [d, g.shared("shared.two", np.array(2.0, np.float32))], f"{prefix}/Pow")
    var = g.node("ReduceMean", [p], f"{prefix}/ReduceMean_1", axes=[-1], keepdims=1)
    ve = g.node("Add", [var, g.shared("shared.eps", np.array(1e-5, np.float32))], f"{prefix}/Add")
    sd = g.node("Sqrt", [ve], f"{prefix}/Sqrt")
    n = g.node("Div", [d, sd], f"{prefix}/Div")
    m = g.node("Mul", [n, gamma], f"{prefix}/Mul")
    return g.node("Add", [m, beta], f"{prefix}/Add_1")


def _linear_matmul(g: GraphBuilder, x: str, prefix: str, n_in: int, n_out: int) -> str:
    w = g.weight(f"{prefix}.weight", (n_in, n_out), n_in)
    b = g.vector(f"{prefix}.bias", n_out)
    y = g.node("MatMul", [x, w], f"{prefix}/MatMul")
    return g.node("Add", [y, b], f"{prefix}/Add")


def _gelu(g: GraphBuilder, x: str, prefix: str) -> str:
    sqrt2 = g.constant(f"{prefix}/Constant", np.array(math.sqrt(2.0), np.float32))
    d = g.node("Div", [x, sqrt2], f"{prefix}/Div")
    e = g.node("Erf", [d], f"{prefix}/Erf")
    a = g.node("Add", [e, g.shared("shared.one", np.array(1.0, np.float32))], f"{prefix}/Add")
    m = g.node("Mul", [x, a], f"{prefix}/Mul")
    half = g.constant(f"{prefix}/Constant_1", np.array(0.5, np.float32))
    return g.node("Mul", [m, half], f"{prefix}/Mul_1")


def _transformer_block(g: GraphBuilder, h: str, mask: str, i: int) -> str:
    p = f"/blocks.{i}"
    a = _layer_norm(g, h, f"{p}/ln_1", decomposed=i % 2 == 1)
    # attention
    q = _linear_matmul(g, a, f"{p}/attn/q", HIDDEN, HIDDEN)
    k = _linear_matmul(g, a, f"{p}/attn/k", HIDDEN, HIDDEN)
    v = _linear_matmul(g, a, f"{p}/attn/v", HIDDEN, HIDDEN)
    shape = g.node("Shape", [a], f"{p}/attn/Shape")
    bs = g.node("Gather", [shape, g.shared("shared.idx01", np.array([0, 1], np.int64))], f"{p}/attn/Gather", axis=0)
    heads_shape = g.node(
        "Concat", [bs, g.shared("shared.heads_shape", np.array([HEADS, HEAD_DIM], np.int64))], f"{p}/attn/Concat", axis=0
    )
    qr = g.node("Reshape", [q, heads_shape], f"{p}/attn/Reshape")
    kr = g.node("Reshape", [k, heads_shape], f"{p}/attn/Reshape_1")
    vr = g.node("Reshape", [v, heads_shape], f"{p}/attn/Reshape_2")
    qt = g.node("Transpose", [qr], f"{p}/attn/Transpose", perm=[0, 2, 1, 3])
    kt = g.node("Transpose", [kr], f"{p}/attn/Transpose_1", perm=[0, 2, 3, 1])
    vt = g.node("Transpose", [vr], f"{p}/attn/Transpose_2", perm=[0, 2, 1, 3])
    scores = g.node("MatMul", [qt, kt], f"{p}/attn/MatMul")
    scale = g.constant(f"{p}/attn/Constant", np.array(math.sqrt(HEAD_DIM), np.float32))
    scores = g.node("Div", [scores, scale], f"{p}/attn/Div")
    scores = g.node("Add", [scores, mask], f"{p}/attn/Add")
    probs = g.node("Softmax", [scores], f"{p}/attn/Softmax", axis=-1)
    ctx = g.node("MatMul", [probs, vt], f"{p}/attn/MatMul_1")
    ctx = g.node("Transpose", [ctx], f"{p}/attn/Transpose_3", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, g.shared("shared.merge_shape", np.array([0, 0, -1], np.int64))], f"{p}/attn/Reshape_3")
    o = _linear_matmul(g, ctx, f"{p}/attn/o", HIDDEN, HIDDEN)
    h = g.node("Add", [h, o], f"{p}/Add")
    # MLP: MatMul form, or (every third block) the 2-D Gemm form torch emits for nn.Linear
    b = _layer_norm(g, h, f"{p}/ln_2", decomposed=i % 2 == 0)
    if i % 3 == 2:
        flat = g.node("Reshape", [b, g.shared("shared.flat_shape", np.array([-1, HIDDEN], np.int64))], f"{p}/mlp/Reshape")
        w1 = g.weight(f"{p}/mlp/fc1.weight", (FF, HIDDEN), HIDDEN)
        y = g.node("Gemm", [flat, w1, g.vector(f"{p}/mlp/fc1.bias", FF)], f"{p}/mlp/fc1/Gemm", transB=1)
        y = _gelu(g, y, f"{p}/mlp/act")
        w2 = g.weight(f"{p}/mlp/fc2.weight", (HIDDEN, FF), FF)
        y = g.node("Gemm", [y, w2, g.vector(f"{p}/mlp/fc2.bias", HIDDEN)], f"{p}/mlp/fc2/Gemm", transB=1)
        y = g.node("Reshape", [y, g.shared("shared.hidden_shape", np.array([1, SEQ, HIDDEN], np.int64))], f"{p}/mlp/Reshape_1")
    else:
        y = _linear_matmul(g, b, f"{p}/mlp/fc1", HIDDEN, FF)
        y = _gelu(g, y, f"{p}/mlp/act")
        y = _linear_matmul(g, y, f"{p}/mlp/fc2", FF, HIDDEN)
    return g.node("Add", [h, y], f"{p}/Add_1")


def _count_new_nodes(g: GraphBuilder, fn, *args) -> tuple[Any, int]:
    before = len(g.nodes)
    out = fn(*args)
    return out, len(g.nodes) - before


def build_transformer(target_nodes: int, seed: int = SEED) -> onnx.ModelProto:
    """A transformer-like graph with about ``target_nodes`` nodes (hidden 16, seq 8)."""
    g = GraphBuilder(seed)
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, SEQ])
    mask_in = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, SEQ])
    # extended attention mask: (1 - float(mask[:, None, None, :])) * -10000
    m = g.node("Unsqueeze", ["attention_mask", g.shared("shared.axes12", np.array([1, 2], np.int64))], "/mask/Unsqueeze")
    m = g.node("Cast", [m], "/mask/Cast", to=TensorProto.FLOAT)
    m = g.node("Sub", [g.shared("shared.one", np.array(1.0, np.float32)), m], "/mask/Sub")
    mask = g.node("Mul", [m, g.constant("/mask/Constant", np.array(-10000.0, np.float32))], "/mask/Mul")
    # embeddings
    emb = g.node("Gather", [g.weight("wte.weight", (VOCAB, HIDDEN), 1, 0.02), "input_ids"], "/wte/Gather", axis=0)
    pos = g.init("wpe.weight", (g.rng.standard_normal((1, SEQ, HIDDEN), dtype=np.float32) * 0.02).astype(np.float32))
    h = g.node("Add", [emb, pos], "/embeddings/Add")
    head_nodes = 2  # final LayerNormalization + lm_head MatMul
    i = 0
    while True:
        h, n_block = _count_new_nodes(g, _transformer_block, g, h, mask, i)
        i += 1
        if len(g.nodes) + head_nodes + n_block // 2 >= target_nodes:
            break
    h = _layer_norm(g, h, "/ln_f", decomposed=False)
    g.node("MatMul", [h, g.weight("lm_head.weight", (HIDDEN, VOCAB), HIDDEN)], "/lm_head/MatMul")
    g.nodes[-1].output[0] = "logits"
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, SEQ, VOCAB])
    graph = helper.make_graph(g.nodes, f"synthetic_transformer_{target_nodes}", [ids, mask_in], [out], g.initializers)
    return _model(graph)


# --------------------------------------------------------------------------- conv


def _conv(g: GraphBuilder, x: str, prefix: str, c_in: int, c_out: int, k: int, group: int = 1, bias: bool = True) -> str:
    w = g.weight(f"{prefix}.weight", (c_out, c_in // group, k, k), c_in // group * k * k, 1.4)
    inputs = [x, w] + ([g.vector(f"{prefix}.bias", c_out)] if bias else [])
    return g.node("Conv", inputs, f"{prefix}/Conv", kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1], group=group)


def _batchnorm(g: GraphBuilder, x: str, prefix: str, c: int) -> str:
    scale = g.vector(f"{prefix}.weight", c, 0.05, 1.0)
    bias = g.vector(f"{prefix}.bias", c, 0.05)
    mean = g.vector(f"{prefix}.running_mean", c, 0.05)
    var = g.init(f"{prefix}.running_var", (1.0 + np.abs(g.rng.standard_normal(c, dtype=np.float32)) * 0.1).astype(np.float32))
    return g.node("BatchNormalization", [x, scale, bias, mean, var], f"{prefix}/BatchNormalization", epsilon=1e-5)


def _conv_block(g: GraphBuilder, x: str, i: int) -> str:
    p = f"/features.{i}"
    c = CHANNELS
    y = _conv(g, x, f"{p}/conv1", c, c, 3, bias=False)
    y = _batchnorm(g, y, f"{p}/bn1", c)
    y = g.node("Relu", [y], f"{p}/Relu")
    if i % 5 == 4:  # depthwise + HardSwish (MobileNet)
        y = _conv(g, y, f"{p}/dw", c, c, 3, group=c)
        y = g.node("HardSwish", [y], f"{p}/HardSwish")
    y = _conv(g, y, f"{p}/conv2", c, c, 3, bias=False)
    y = _batchnorm(g, y, f"{p}/bn2", c)
    if i % 3 == 2:  # squeeze-excite
        s = g.node("GlobalAveragePool", [y], f"{p}/se/GlobalAveragePool")
        s = _conv(g, s, f"{p}/se/fc1", c, c // 2, 1)
        s = g.node("Relu", [s], f"{p}/se/Relu")
        s = _conv(g, s, f"{p}/se/fc2", c // 2, c, 1)
        s = g.node("HardSigmoid", [s], f"{p}/se/HardSigmoid", alpha=1.0 / 6, beta=0.5)
        y = g.node("Mul", [y, s], f"{p}/se/Mul")
    y = g.node("Add", [x, y], f"{p}/Add")
    lo = g.shared("shared.clip_min", np.array(0.0, np.float32))
    hi = g.shared("shared.clip_max", np.array(6.0, np.float32))
    return g.node("Clip", [y, lo, hi], f"{p}/Clip")  # ReLU6 bounds activations at any depth


def build_conv(target_nodes: int, seed: int = SEED) -> onnx.ModelProto:
    """A conv-net-like graph with about ``target_nodes`` nodes (8 channels, 16x16)."""
    g = GraphBuilder(seed)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, SPATIAL, SPATIAL])
    x = _conv(g, "input", "/stem", 3, CHANNELS, 3)
    x = g.node("Relu", [x], "/stem/Relu")
    head_nodes = 9
    i = 0
    while True:
        x, n_block = _count_new_nodes(g, _conv_block, g, x, i)
        i += 1
        if len(g.nodes) + head_nodes + n_block // 2 >= target_nodes:
            break
    pooled = g.node("GlobalAveragePool", [x], "/avgpool/GlobalAveragePool")
    shape = g.node("Shape", [pooled], "/flatten/Shape")
    batch = g.node("Gather", [shape, g.constant("/flatten/Constant", np.array(0, np.int64))], "/flatten/Gather", axis=0)
    batch = g.node("Unsqueeze", [batch, g.shared("shared.axes0", np.array([0], np.int64))], "/flatten/Unsqueeze")
    flat_shape = g.node("Concat", [batch, g.shared("shared.minus_one", np.array([-1], np.int64))], "/flatten/Concat", axis=0)
    flat = g.node("Reshape", [pooled, flat_shape], "/flatten/Reshape")
    w = g.weight("classifier.weight", (CLASSES, CHANNELS), CHANNELS)
    y = g.node("Gemm", [flat, w, g.vector("classifier.bias", CLASSES)], "/classifier/Gemm", transB=1)
    g.node("Softmax", [y], "/Softmax", axis=-1)
    g.nodes[-1].output[0] = "probs"
    out = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, CLASSES])
    graph = helper.make_graph(g.nodes, f"synthetic_conv_{target_nodes}", [inp], [out], g.initializers)
    return _model(graph)


# --------------------------------------------------------------------------- big (external data)


def write_big_model(path: Path, layers: int = 48, dim: int = 4096, seed: int = SEED) -> dict[str, Any]:
    """An MLP of ``layers`` dim x dim fp32 MatMul weights in external data.

    The weights go into ``<path>.data`` one at a time (numpy ``tofile``), the
    graph's TensorProtos point at them (location / offset / length); nothing
    but one weight is ever held in memory. Returns sizes.
    """
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    data_path = path.with_name(data_name)
    nodes, initializers = [], []
    offset = 0
    x = "input"
    with open(data_path, "wb") as f:
        for i in range(layers):
            w = rng.standard_normal((dim, dim), dtype=np.float32)
            w *= np.float32(math.sqrt(2.0 / dim))
            start = f.tell()
            assert start == offset
            w.tofile(f)
            length = w.nbytes
            del w
            t = TensorProto()
            t.name = f"layers.{i}.weight"
            t.data_type = TensorProto.FLOAT
            t.dims.extend([dim, dim])
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            initializers.append(t)
            offset += length
            p = f"/layers.{i}"
            b = (rng.standard_normal(dim, dtype=np.float32) * 0.01).astype(np.float32)
            bias = numpy_helper.from_array(b, f"layers.{i}.bias")
            initializers.append(bias)
            y = helper.make_node("MatMul", [x, t.name], [f"{p}/MatMul_output_0"], name=f"{p}/MatMul")
            a = helper.make_node("Add", [y.output[0], bias.name], [f"{p}/Add_output_0"], name=f"{p}/Add")
            nodes += [y, a]
            x = a.output[0]
            if i % 8 == 7:
                gamma = numpy_helper.from_array(np.ones(dim, np.float32), f"layers.{i}.norm.weight")
                beta = numpy_helper.from_array(np.zeros(dim, np.float32), f"layers.{i}.norm.bias")
                initializers += [gamma, beta]
                ln = helper.make_node(
                    "LayerNormalization", [x, gamma.name, beta.name], [f"{p}/norm_output_0"], name=f"{p}/norm", axis=-1
                )
                nodes.append(ln)
                x = ln.output[0]
            if i < layers - 1:
                r = helper.make_node("Relu", [x], [f"{p}/Relu_output_0"], name=f"{p}/Relu")
                nodes.append(r)
                x = r.output[0]
        f.flush()
        os.fsync(f.fileno())
    nodes.append(helper.make_node("Softmax", [x], ["output"], name="/Softmax", axis=-1))
    graph = helper.make_graph(
        nodes,
        f"synthetic_big_{layers}x{dim}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, dim])],
        initializers,
    )
    model = _model(graph)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return {
        "external_bytes": offset,
        "graph_bytes": path.stat().st_size,
        "node_count": len(nodes),
        "fp32_weight_bytes": float_weight_bytes(model),
    }


# --------------------------------------------------------------------------- checks, cache


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="amp-convert synthetic")
    model.ir_version = IR_VERSION
    return model


def float_weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of fp32 initializers (external ones by their length)."""
    total = 0
    for t in model.graph.initializer:
        if t.data_type != TensorProto.FLOAT:
            continue
        if t.data_location == TensorProto.EXTERNAL:
            total += int({e.key: e.value for e in t.external_data}.get("length", 0))
        else:
            total += 4 * int(np.prod(t.dims, dtype=np.int64))
    return total


def run_in_ort(path: Path, entry: dict[str, Any]) -> list[np.ndarray]:
    import onnxruntime as ort

    sys.path.insert(0, str(HERE))
    from zoo_inputs import make_inputs

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, make_inputs(entry, seed=0))
    for o in outs:
        if o.dtype.kind == "f" and not np.isfinite(o).all():
            raise RuntimeError(f"{path.name}: non-finite outputs in onnxruntime")
    return outs


def _atomic_save(model: onnx.ModelProto, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_manifest() -> dict[str, dict[str, Any]]:
    if not MANIFEST.is_file():
        return {}
    return {e["name"]: e for e in json.loads(MANIFEST.read_text(encoding="utf-8")).get("models", [])}


def _store_manifest(entries: dict[str, dict[str, Any]]) -> None:
    models = [{k: v for k, v in e.items() if k != "path"} for e in sorted(entries.values(), key=lambda e: e["name"])]
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".tmp", dir=CACHE_DIR)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"models": models}, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, MANIFEST)


def _inputs(kind: str) -> list[dict[str, Any]]:
    if kind == "transformer":
        return [
            {"name": "input_ids", "shape": [1, SEQ], "dtype": "int64", "low": 0, "high": VOCAB},
            {"name": "attention_mask", "shape": [1, SEQ], "dtype": "int64", "low": 0, "high": 2, "value": 1},
        ]
    if kind == "conv":
        return [{"name": "input", "shape": [1, 3, SPATIAL, SPATIAL], "dtype": "float32", "low": -1.0, "high": 1.0}]
    return [{"name": "input", "shape": [1, 4096], "dtype": "float32", "low": -1.0, "high": 1.0}]


def _cached(name: str, force: bool) -> dict[str, Any] | None:
    entry = _load_manifest().get(name)
    if force or entry is None or entry.get("builder_version") != BUILDER_VERSION:
        return None
    path = CACHE_DIR / entry["file"]
    if not path.is_file():
        return None
    if entry.get("external_data") and not (CACHE_DIR / entry["external_data"]).is_file():
        return None
    return {**entry, "path": str(path)}


def _record(entry: dict[str, Any]) -> dict[str, Any]:
    entries = _load_manifest()
    entries[entry["name"]] = entry
    _store_manifest(entries)
    return {**entry, "path": str(CACHE_DIR / entry["file"])}


BUILDERS = {"transformer": build_transformer, "conv": build_conv}


def ensure_model(kind: str, nodes: int, force: bool = False, verbose: bool = True) -> dict[str, Any]:
    """The cached ``kind`` model of about ``nodes`` nodes, built (checked, run) if missing."""
    name = f"{kind}_{size_label(nodes)}"
    entry = _cached(name, force)
    if entry is not None:
        return entry
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    model = BUILDERS[kind](nodes)
    onnx.checker.check_model(model, full_check=True)
    path = CACHE_DIR / f"{name}.onnx"
    _atomic_save(model, path)
    entry = {
        "name": name,
        "file": path.name,
        "kind": kind,
        "source": f"models/synthetic.py build_{kind}({nodes}), seed {SEED}",
        "builder_version": BUILDER_VERSION,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "inputs": _inputs(kind),
        "outputs": [o.name for o in model.graph.output],
        "node_count": len(model.graph.node),
        "initializer_count": len(model.graph.initializer),
        "fp32_weight_bytes": float_weight_bytes(model),
        "size_bytes": path.stat().st_size,
        "checker_ok": True,
    }
    del model
    run_in_ort(path, entry)
    entry["ort_ok"] = True
    if verbose:
        print(
            f"built {path} ({entry['node_count']} nodes, {entry['size_bytes'] / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
        )
    return _record(entry)


def ensure_big_model(layers: int = 48, dim: int = 4096, force: bool = False, verbose: bool = True) -> dict[str, Any]:
    """The cached external-data MLP (``layers`` x dim x dim fp32), built if missing."""
    name = f"big_{layers}x{dim}"
    entry = _cached(name, force)
    if entry is not None:
        return entry
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    path = CACHE_DIR / f"{name}.onnx"
    tmp = CACHE_DIR / f".{name}.building"
    tmp.mkdir(exist_ok=True)
    tmp_path = tmp / path.name
    sizes = write_big_model(tmp_path, layers, dim)
    onnx.checker.check_model(str(tmp_path), full_check=True)
    os.replace(tmp_path.with_name(path.name + ".data"), path.with_name(path.name + ".data"))
    os.replace(tmp_path, path)
    tmp.rmdir()
    entry = {
        "name": name,
        "file": path.name,
        "external_data": path.name + ".data",
        "kind": "big",
        "source": f"models/synthetic.py write_big_model(layers={layers}, dim={dim}), seed {SEED}",
        "builder_version": BUILDER_VERSION,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "inputs": _inputs("big"),
        "outputs": ["output"],
        "node_count": sizes["node_count"],
        "fp32_weight_bytes": sizes["fp32_weight_bytes"],
        "size_bytes": sizes["graph_bytes"] + sizes["external_bytes"],
        "checker_ok": True,
    }
    if verbose:
        gib = sizes["external_bytes"] / 2**30
        print(f"built {path} (+ {gib:.2f} GiB external) in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return _record(entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="transformer", help="comma-separated: transformer,conv")
    parser.add_argument("--sizes", default="2k,10k,40k,100k", help="node counts, e.g. 2k,10k,40k,100k ('' for none)")
    parser.add_argument("--big", action="store_true", help="also the 3 GiB external-data model")
    parser.add_argument("--big-layers", type=int, default=48)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args()
    for kind in [k for k in args.kinds.split(",") if k]:
        if kind not in BUILDERS:
            parser.error(f"unknown kind {kind!r} (choose from {', '.join(BUILDERS)})")
        for size in [s for s in args.sizes.split(",") if s]:
            e = ensure_model(kind, parse_size(size), args.force)
            print(f"{e['path']}: {e['node_count']} nodes, {e['size_bytes'] / 1e6:.1f} MB")
    if args.big:
        e = ensure_big_model(args.big_layers, force=args.force)
        print(f"{e['path']}: {e['node_count']} nodes, {e['size_bytes'] / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
