"""Folding BatchNormalization into the Conv before it (fold.py), and what onnxruntime's fusions make of the zoo's CNNs."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import init, model, value
from onnx import helper
from onnxconverter_common import float16

from amp_convert import convert
from amp_convert.fold import FoldBatchNormalization
from amp_convert.plan import Precision

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"
RNG = np.random.default_rng(7)


def _bn_params(prefix: str, c: int, var_scale: float = 1.0) -> list[onnx.TensorProto]:
    return [
        init(f"{prefix}_g", RNG.uniform(0.5, 1.5, c).astype(np.float32)),
        init(f"{prefix}_b", RNG.normal(0, 0.1, c).astype(np.float32)),
        init(f"{prefix}_m", RNG.normal(0, 0.2, c).astype(np.float32)),
        init(f"{prefix}_v", (RNG.uniform(0.5, 2.0, c) * var_scale).astype(np.float32)),
    ]


def _bn(prefix: str, x: str, y: str, **attrs) -> onnx.NodeProto:
    names = [x, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"]
    return helper.make_node("BatchNormalization", names, [y], name=f"{prefix}_bn", **attrs)


def _cases() -> onnx.ModelProto:
    """x (1x4x6x6) through five Conv+BN pairs: with bias; without bias; grouped ConvTranspose;
    one whose weight another Conv shares; one in training mode (not folded); and one whose
    Conv output a second node reads (not folded)."""
    w = lambda *shape: init(f"w{len(shape)}_{'x'.join(map(str, shape))}", RNG.normal(0, 0.3, shape).astype(np.float32))  # noqa: E731
    w1, w2, wt, ws = (
        w(4, 4, 3, 3),
        init("w_nobias", RNG.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32)),
        init("w_t", RNG.normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32)),
        init("w_shared", RNG.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)),
    )
    nodes = [
        helper.make_node("Conv", ["x", w1.name, "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        _bn("a", "c1", "y1"),
        helper.make_node("Conv", ["y1", "w_nobias"], ["c2"], name="conv2"),
        _bn("b", "c2", "y2", epsilon=1e-3),
        helper.make_node("ConvTranspose", ["y2", "w_t"], ["c3"], name="convt", group=2, pads=[1, 1, 1, 1]),
        _bn("c", "c3", "y3"),  # ConvTranspose with group 2: 2 x 2 = 4 output channels
        helper.make_node("Conv", ["y3", "w_shared"], ["c4"], name="conv4", pads=[1, 1, 1, 1]),
        _bn("d", "c4", "y4"),
        helper.make_node("Conv", ["y4", "w_shared"], ["c5"], name="conv5", pads=[1, 1, 1, 1]),  # (reads the unfolded weight)
        _bn("e", "c5", "y5"),
        helper.make_node("Relu", ["c5"], ["r5"], name="relu5"),  # (c5 read twice: its BN is not folded)
        helper.make_node("Add", ["y5", "r5"], ["y"], name="add"),
    ]
    inits = [w1, w2, wt, ws, init("b1", RNG.normal(0, 0.1, 4).astype(np.float32))]
    for p in "abcde":
        inits += _bn_params(p, 4)
    return model(nodes, [value("x", shape=(1, 4, 6, 6))], [value("y", shape=(1, 4, 6, 6))], inits)


def _run(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_folding_computes_the_same_in_fp32():
    original = _cases()
    folded = onnx.ModelProto()
    folded.CopyFrom(original)
    result = FoldBatchNormalization()(folded)
    assert result.modified
    assert result.folded == [("conv1", "a_bn"), ("conv2", "b_bn"), ("convt", "c_bn"), ("conv4", "d_bn")]
    onnx.checker.check_model(folded, full_check=True)
    ops = collections.Counter(n.op_type for n in folded.graph.node)
    assert ops["BatchNormalization"] == 1  # e_bn: its Conv's output is read twice
    # conv5 still reads the weight as it was; conv4 reads a folded copy
    conv4, conv5 = (next(n for n in folded.graph.node if n.name == k) for k in ("conv4", "conv5"))
    assert conv5.input[1] == "w_shared" and conv4.input[1] != "w_shared"
    feeds = {"x": RNG.normal(0, 1, (1, 4, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(_run(folded, feeds)[0], _run(original, feeds)[0], rtol=1e-4, atol=1e-5)


def test_training_mode_and_values_fp16_cannot_hold_are_left():
    x = value("x", shape=(1, 2, 4, 4))
    train = _bn("t", "c", "y", training_mode=1)
    train.output.extend(["running_mean", "running_var"])  # (training mode gives the updated statistics too)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), train]
    w = init("w", np.ones((2, 2, 1, 1), np.float32))
    outs = [value("y", shape=(1, 2, 4, 4)), value("running_mean", shape=(2,)), value("running_var", shape=(2,))]
    m = model(nodes, [x], outs, [w, *_bn_params("t", 2)], opset=15)
    assert not FoldBatchNormalization()(m).modified
    # variance 1e-12: the folded weight (about 1e6) is beyond fp16's range
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _bn("u", "c", "y", epsilon=1e-12)]
    m = model(nodes, [x], [value("y", shape=(1, 2, 4, 4))], [w, *_bn_params("u", 2, var_scale=1e-12)])
    plan = convert(m, level="O2", check="none").plan
    assert plan.by_name("u_bn").precision == Precision.FP32  # not folded: still there, and fp32


@pytest.fixture(scope="module")
def resnet() -> onnx.ModelProto:
    return onnx.load(ZOO / "resnet50.onnx")


def test_o2_folds_batchnorm_and_says_so(resnet):
    result = convert(resnet, level="O2", check="none")
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["BatchNormalization"] == 0
    assert ops["Conv"] == collections.Counter(n.op_type for n in resnet.graph.node)["Conv"]
    assert all(e.precision == Precision.LOW for e in result.plan if e.op_type == "Conv")
    assert len(result.plan.folded) == 16 and ("/bn1/BatchNormalization", "/conv1/Conv") in result.plan.folded
    [note] = [n for n in result.plan.notes if "folded into the Conv" in n]
    assert note.startswith("16 BatchNormalization nodes folded") and "`fold_batchnorm` false keeps the nodes" in note
    assert result.casts_after == 2  # the model's input and output only


def test_no_fold_at_o3_or_when_asked_or_for_nodes_kept_by_name(resnet):
    def bn_count(**options) -> int:
        m = convert(resnet, check="none", **options).model
        return sum(n.op_type == "BatchNormalization" for n in m.graph.node)

    assert bn_count(level="O3") == 16  # O3 runs BatchNormalization low: nothing to keep fp32
    assert bn_count(level="O2", fold_batchnorm=False) == 16
    assert bn_count(level="O2", keep_fp32=("layer1.*bn1",)) == 1
    assert bn_count(level="O1", force_low=("^/bn1/",)) == 1  # forced low: planned low, not folded


def _after_onnxruntime(m: onnx.ModelProto, tmp_path: Path, name: str) -> collections.Counter:
    """Op counts of ``m`` as onnxruntime's basic graph optimizations (Conv+BatchNormalization fusion
    among them) leave it; Casts onnxruntime inserted for the CPU provider's missing fp16 kernels not counted."""
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.opt.onnx"
    onnx.save(m, src)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    nodes = onnx.load(dst).graph.node
    return collections.Counter(n.op_type for n in nodes if not n.name.startswith("InsertedPrecisionFreeCast"))


def test_onnxruntime_fuses_what_is_left_as_it_does_for_the_peers(resnet, tmp_path):
    ours = _after_onnxruntime(convert(resnet, level="O2", check="none").model, tmp_path, "ours")
    unfolded = _after_onnxruntime(convert(resnet, level="O2", fold_batchnorm=False, check="none").model, tmp_path, "unfolded")
    peer = _after_onnxruntime(float16.convert_float_to_float16(resnet, keep_io_types=True), tmp_path, "peer")
    assert unfolded["BatchNormalization"] == 16  # the Cast pairs around them block the fusion
    assert ours["BatchNormalization"] == peer["BatchNormalization"] == 0
    assert ours["Cast"] <= peer["Cast"]
    assert sum(ours.values()) <= sum(peer.values())


@pytest.mark.parametrize("name", ["convnext", "mobilenetv3"])
def test_other_cnns_leave_no_more_casts_after_onnxruntime_than_the_peer(name, tmp_path):
    """ConvNeXt's LayerNormalization follows (its statistics stay fp32 inside): no Cast pairs around it."""
    given = onnx.load(ZOO / f"{name}.onnx")
    ours = _after_onnxruntime(convert(given, level="O2", check="none").model, tmp_path, "ours")
    peer = _after_onnxruntime(float16.convert_float_to_float16(given, keep_io_types=True), tmp_path, "peer")
    assert ours["BatchNormalization"] <= peer["BatchNormalization"]
    assert ours["Cast"] <= peer["Cast"]
