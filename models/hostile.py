"""fp16-hostile models: small graphs whose fp32 values do not survive fp16.

Static lists cannot see these problems; the converter's safety rules and
``--level auto`` must. Each builder returns a model that passes the full
checker; inputs are uniform in [-1, 1) (``make_inputs``).

    python models/hostile.py OUT_DIR     # writes the models as .onnx files
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, inits, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="amp-convert hostile zoo")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _f32(shape, scale, seed):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def batchnorm_large_variance() -> onnx.ModelProto:
    """Conv activations of order 1e4 normalised by a BatchNorm whose running
    variance is 1e8: the variance itself overflows fp16."""
    c = 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])
    inits = {
        "w1": _f32((c, 4, 3, 3), 300.0, 1),
        "scale": np.ones(c, np.float32),
        "bias": np.zeros(c, np.float32),
        "mean": np.zeros(c, np.float32),
        "var": np.full(c, 1e8, np.float32),
        "w2": _f32((c, c, 1, 1), 0.3, 2),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    return _model(nodes, [x], [y], inits, "batchnorm_large_variance")


def softmax_large_logits() -> onnx.ModelProto:
    """A classifier head whose logits reach ~1e5 before the Softmax."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    inits = {"w1": _f32((32, 64), 0.3, 3), "w2": _f32((64, 16), 2e4, 4)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="hidden"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["logits"], name="logits"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    return _model(nodes, [x], [y], inits, "softmax_large_logits")


def layernorm_large_sums() -> onnx.ModelProto:
    """LayerNorm decomposed into ReduceMean/Sub/Pow/Sqrt/Div on activations of
    order 300: the squares (9e4) overflow fp16."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 32])
    inits = {
        "w_in": _f32((64, 64), 60.0, 5),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "gamma": np.ones(64, np.float32),
        "beta": np.zeros(64, np.float32),
        "w_out": _f32((64, 32), 0.2, 6),
        "axes": np.array([-1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="proj_in"),
        helper.make_node("ReduceMean", ["h"], ["mu"], name="mean", axes=[-1]),
        helper.make_node("Sub", ["h", "mu"], ["d"], name="center"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="square"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="variance", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
        helper.make_node("Div", ["d", "std"], ["n"], name="normalize"),
        helper.make_node("Mul", ["n", "gamma"], ["ng"], name="gamma"),
        helper.make_node("Add", ["ng", "beta"], ["nb"], name="beta"),
        helper.make_node("MatMul", ["nb", "w_out"], ["y"], name="proj_out"),
    ]
    del inits["axes"]
    return _model(nodes, [x], [y], inits, "layernorm_large_sums")


def exp_pow_large() -> onnx.ModelProto:
    """Exp of values up to ~15 and a cube of values up to ~60: both overflow fp16."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    inits = {
        "w1": _f32((16, 16), 4.0, 7),
        "w2": _f32((16, 16), 15.0, 8),
        "three": np.array(3.0, np.float32),
        "shrink": np.array(1e-5, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="proj_a"),
        helper.make_node("Exp", ["a"], ["ea"], name="exp"),
        helper.make_node("MatMul", ["x", "w2"], ["b"], name="proj_b"),
        helper.make_node("Pow", ["b", "three"], ["b3"], name="cube"),
        helper.make_node("Add", ["ea", "b3"], ["s"], name="sum"),
        helper.make_node("Mul", ["s", "shrink"], ["y"], name="rescale"),
    ]
    return _model(nodes, [x], [y], inits, "exp_pow_large")


def attention_unscaled() -> onnx.ModelProto:
    """Self-attention without the 1/sqrt(d) scale on large activations: the
    Q.K^T scores reach ~1e5."""
    s, d = 16, 64
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, d])
    inits = {
        "wq": _f32((d, d), 12.0, 9),
        "wk": _f32((d, d), 12.0, 10),
        "wv": _f32((d, d), 0.2, 11),
        "wo": _f32((d, d), 0.2, 12),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["y"], name="out_proj"),
    ]
    return _model(nodes, [x], [y], inits, "attention_unscaled")


HOSTILE: dict[str, Callable[[], onnx.ModelProto]] = {
    "batchnorm_large_variance": batchnorm_large_variance,
    "softmax_large_logits": softmax_large_logits,
    "layernorm_large_sums": layernorm_large_sums,
    "exp_pow_large": exp_pow_large,
    "attention_unscaled": attention_unscaled,
}

# The node whose fp16 execution breaks each model (what a plan must keep fp32).
CULPRITS = {
    "batchnorm_large_variance": "bn",
    "softmax_large_logits": "logits",
    "layernorm_large_sums": "square",
    "exp_pow_large": "exp",
    "attention_unscaled": "scores",
}


def make_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
    return feeds


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "models/cache/hostile")
    out.mkdir(parents=True, exist_ok=True)
    for name, build in HOSTILE.items():
        onnx.save(build(), str(out / f"{name}.onnx"))
        print(out / f"{name}.onnx")
