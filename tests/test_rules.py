"""Each classification and rewriting rule on a small graph built for it.

Assertions are on the plan (precision + rule per node) and on the written
graph (which nodes are low, where Casts are, how many, initializer dtypes),
and every converted model passes the full checker (convert runs it) and,
for fp16, runs in onnxruntime.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import (
    BF16,
    F16,
    F32,
    I64,
    attr,
    casts_into,
    elem_types,
    init,
    init_type,
    local_function_model,
    model,
    nodes_of,
    pads_model,
    run,
    shape_readers_model,
    value,
)
from onnx import TensorProto, helper, numpy_helper

import amp_convert
from amp_convert import ConvertOptions, Precision, convert
from amp_convert.cleanup import count_casts
from amp_convert.emulate import emulation_twin
from amp_convert.errors import AmpError
from models.zoo_inputs import iter_nodes

RNG = np.random.default_rng(0)


def w(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def close(a, b, tol=2e-2):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.max(np.abs(a - b)) <= tol * (np.max(np.abs(a)) + 1e-3)


def x_feed(shape=(2, 4)):
    return {"x": RNG.standard_normal(shape).astype(np.float32)}


def mm_chain(middle_ops=("Softmax",)):
    """x -> MatMul(W1) -> middle ops -> MatMul(W2) -> y."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"], name="mm1")]
    prev = "h0"
    for i, op in enumerate(middle_ops):
        kwargs = {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, [prev], [f"h{i + 1}"], name=f"mid{i}", **kwargs))
        prev = f"h{i + 1}"
    nodes.append(helper.make_node("MatMul", [prev, "W2"], ["y"], name="mm2"))
    return model(nodes, [value("x")], [value("y")], [init("W1", w(4, 4)), init("W2", w(4, 4))])


# ---------------------------------------------------------------- levels / lists


def test_o1_follow_ops_between_white_ops_need_no_casts():
    m = mm_chain(("Relu", "Neg", "Identity"))
    out, plan = convert(m, level="O1")
    assert {e.name: e.precision for e in plan} == {n: Precision.LOW for n in ("mm1", "mid0", "mid1", "mid2", "mm2")}
    assert plan.by_name("mid1").rule == "follow"
    # one Cast in (x -> fp16), one out (y back to fp32), none in between
    casts = nodes_of(out, "Cast")
    assert len(casts) == 2
    assert casts_into(out, "x") and [n.output[0] for n in casts if n.output[0] == "y"] == ["y"]
    types = elem_types(out)
    assert types["h0"] == types["h2"] == F16
    assert init_type(out, "W1") == init_type(out, "W2") == F16
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_black_list_op_stays_fp32_between_low_ops(level):
    m = mm_chain(("Softmax",))
    out, plan = convert(m, level=level)
    assert plan.by_name("mid0").precision is Precision.FP32 and plan.by_name("mid0").rule == "black-list"
    assert plan.by_name("mm1").precision is Precision.LOW and plan.by_name("mm2").precision is Precision.LOW
    types = elem_types(out)
    assert types["h0"] == F16 and types["h1"] == F32
    assert len(nodes_of(out, "Cast")) == 4  # x in, h0 up, h1 down, y out
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_o3_runs_black_list_ops_low():
    m = mm_chain(("Softmax",))
    out, plan = convert(m, level="O3")
    assert all(e.precision is Precision.LOW for e in plan)
    assert len(nodes_of(out, "Cast")) == 2


def test_o0_changes_nothing():
    m = mm_chain(("Softmax",))
    out, plan = convert(m, level="O0")
    assert all(e.precision is not Precision.LOW for e in plan)
    assert out.graph == m.graph


@pytest.mark.parametrize(("level", "expected"), [("O1", Precision.FP32), ("O2", Precision.LOW)])
def test_unlisted_op_is_fp32_at_o1_and_low_at_o2(level, expected):
    # The mindspore profile does not list Softmax: it is "unlisted".
    _, plan = convert(mm_chain(("Softmax",)), level=level, lists="mindspore")
    assert plan.by_name("mid0").precision is expected
    assert plan.by_name("mid0").rule == "level"


def test_user_white_and_black_lists_move_ops():
    m = mm_chain(("Softmax",))
    _, plan = convert(m, level="O2", white_list=["Softmax"], black_list=["MatMul"])
    assert plan.by_name("mid0").precision is Precision.LOW and plan.by_name("mid0").rule == "white-list"
    assert plan.by_name("mm1").precision is Precision.FP32 and plan.by_name("mm1").reason == "black list: `black_list`"


def test_only_white_list_behaves_as_o1_with_that_list():
    _, plan = convert(mm_chain(("Softmax",)), only_white_list=["Softmax"])
    assert plan.level == "O1"
    assert plan.by_name("mid0").precision is Precision.LOW
    assert plan.by_name("mm1").precision is Precision.FP32


def test_only_black_list_behaves_as_o2_with_that_list():
    _, plan = convert(mm_chain(("Softmax",)), only_black_list=["MatMul"])
    assert plan.level == "O2"
    assert plan.by_name("mid0").precision is Precision.LOW
    assert plan.by_name("mm1").precision is Precision.FP32


def test_node_name_rules_beat_the_lists():
    m = mm_chain(("Softmax",))
    _, plan = convert(m, level="O2", keep_fp32=["^mm1$"], force_low=["mid"])
    assert plan.by_name("mm1").precision is Precision.FP32 and plan.by_name("mm1").rule == "user-keep-fp32"
    assert plan.by_name("mid0").precision is Precision.LOW and plan.by_name("mid0").rule == "user-force-low"


def test_an_unnamed_node_is_labelled_apart_from_a_node_named_like_its_label():
    """An unnamed node is labelled OpType_index; where another node holds
    that name, a rule naming that node must not also select the unnamed one,
    and the plan's labels stay one per node (auto's weights key on them)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),  # unnamed: MatMul_0
        helper.make_node("Softmax", ["h0"], ["h1"], name="sm", axis=-1),
        helper.make_node("MatMul", ["h1", "W2"], ["y"], name="MatMul_0"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W1", w(4, 4)), init("W2", w(4, 4))])
    _, plan = convert(m, level="O2", keep_fp32=["^MatMul_0$"])
    entries = plan.entries[""]
    assert len({e.name for e in entries}) == 3
    assert entries[2].name == "MatMul_0" and entries[2].rule == "user-keep-fp32"
    assert entries[0].name != "MatMul_0" and entries[0].precision is Precision.LOW
    assert plan.by_name(entries[0].name) is entries[0]


def batchnorm_model():
    x = value("x", shape=(1, 2, 3, 3))
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["y"], name="bn"),
    ]
    inits = [init("W", w(2, 2, 1, 1)), init("s", w(2)), init("b", w(2)), init("mean", w(2)), init("var", np.ones(2, np.float32))]
    return model(nodes, [x], [value("y", shape=(1, 2, 3, 3))], inits)


@pytest.mark.parametrize(
    ("level", "keep", "expected"),
    [
        ("O2", None, Precision.FP32),
        ("O2", False, Precision.LOW),
        ("O3", None, Precision.LOW),
        ("O3", True, Precision.FP32),
    ],
)
def test_keep_batchnorm_fp32(level, keep, expected):
    # (kept fp32, it would be folded into the Conv: see test_fold.py)
    out, plan = convert(batchnorm_model(), level=level, keep_batchnorm_fp32=keep, fold_batchnorm=False)
    assert plan.by_name("bn").precision is expected
    assert init_type(out, "var") == (F16 if expected is Precision.LOW else F32)


# ---------------------------------------------------------------- schema rules


def test_resize_scales_stay_float32():
    x = value("x", shape=(1, 2, 4, 4))
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], name="resize", mode="nearest"),
        helper.make_node("Conv", ["r", "W2"], ["y"], name="conv2"),
    ]
    inits = [init("W", w(2, 2, 1, 1)), init("scales", np.array([1, 1, 2, 2], np.float32)), init("W2", w(2, 2, 1, 1))]
    m = model(nodes, [x], [value("y", shape=(1, 2, 8, 8))], inits)
    out, plan = convert(m, level="O1")
    resize = plan.by_name("resize")
    assert resize.precision is Precision.LOW and resize.low_inputs == (0,)
    assert init_type(out, "scales") == F32
    assert not casts_into(out, "scales")
    feeds = {"x": RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_op_whose_schema_has_no_low_type_stays_fp32_even_at_o3():
    boxes, scores = value("boxes", shape=(1, 3, 4)), value("scores", shape=(1, 1, 3))
    nodes = [
        helper.make_node("Relu", ["boxes"], ["b"], name="relu"),
        helper.make_node("NonMaxSuppression", ["b", "scores"], ["sel"], name="nms"),
    ]
    m = model(nodes, [boxes, scores], [value("sel", I64, shape=("n", 3))])
    out, plan = convert(m, level="O3")
    nms = plan.by_name("nms")
    assert nms.precision is Precision.FP32 and nms.rule == "schema"
    assert "admits no float16" in nms.reason
    assert elem_types(out)["b"] == F16 and len(casts_into(out, "b")) == 1


def test_bf16_follows_the_schema_at_the_models_opset():
    def conv(opset):
        x = value("x", shape=(1, 2, 3, 3))
        y = value("y", shape=(1, 2, 3, 3))
        return model(
            [helper.make_node("Conv", ["x", "W"], ["y"], name="conv")], [x], [y], [init("W", w(2, 2, 1, 1))], opset=opset
        )

    _, plan17 = convert(conv(17), level="O1", dtype="bf16")
    assert plan17.by_name("conv").precision is Precision.FP32 and plan17.by_name("conv").rule == "schema"
    out22, plan22 = convert(conv(22), level="O1", dtype="bf16")
    assert plan22.by_name("conv").precision is Precision.LOW
    assert init_type(out22, "W") == BF16
    # The plan says once why the Convs stay fp32, and what would let them run low.
    upgrade = "Conv stay fp32: the schemas at opset 17 admit no bfloat16 for them; `target_opset` 22 upgrades"
    hints = [n for n in plan17.notes if "`target_opset`" in n]
    assert len(hints) == 1 and hints[0].startswith(upgrade)
    assert not [n for n in plan22.notes if "`target_opset`" in n]


def _onnxruntime_loads(opset: int) -> bool:
    """Asked of onnxruntime itself: a one-node model at ``opset`` and the oldest IR version that pairs with it."""
    ids = [helper.make_opsetid("", opset)]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [value("x")], [value("y")])
    probe = helper.make_model(graph, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # (onnxruntime raises its own exception types)
        return False
    return True


def test_a_schema_hint_names_no_target_opset_onnxruntime_cannot_load():
    """A float Range admits float16 only from an opset newer than onnxruntime
    loads (27, against 1.31's 26): the reason says so, and suggests no
    `target_opset` that would only move the refusal to the runtime."""
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
        helper.make_node("Add", ["x", "r"], ["y"], name="add"),
    ]
    inits = [init("start", np.float32(0)), init("limit", np.float32(4)), init("delta", np.float32(1))]
    m = model(nodes, [value("x", shape=(4,))], [value("y", shape=(4,))], inits)
    _, plan = convert(m, level="O3")
    reason = plan.by_name("range").reason
    newer = int(re.search(r"it does from opset (\d+)", reason).group(1))
    if _onnxruntime_loads(newer):
        pytest.skip(f"onnxruntime {ort.__version__} loads opset {newer}: the hint may name it")
    assert f"which onnxruntime {ort.__version__} does not load" in reason
    assert "`target_opset`" not in reason and not [n for n in plan.notes if "`target_opset`" in n]


def test_integer_computation_is_untouched():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Add", ["s", "one"], ["s1"], name="int_add"),
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
    ]
    inits = [init("W", w(4, 4)), init("one", np.array([1], np.int64))]
    m = model(nodes, [value("x")], [value("y"), value("s1", I64, shape=(2,))], inits)
    out, plan = convert(m, level="O3")
    assert plan.by_name("int_add").precision is Precision.UNCHANGED and plan.by_name("int_add").rule == "no-float32"
    assert init_type(out, "one") == I64


def test_custom_domain_ops_are_fp32_unless_listed():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("MyOp", ["h"], ["y"], name="custom", domain="com.example"),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [value("x")], [value("y")], [init("W", w(4, 4))]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    m.ir_version = 8
    out, plan = convert(m, level="O3")
    assert plan.by_name("custom").precision is Precision.FP32 and plan.by_name("custom").rule == "custom-domain"
    assert len(casts_into(out, "h")) == 1
    out2, plan2 = convert(m, level="O3", white_list=["com.example::MyOp"])
    assert plan2.by_name("custom").precision is Precision.LOW
    assert not casts_into(out2, "h")


def test_a_custom_domain_op_named_cast_is_not_counted_as_a_cast_and_its_body_is():
    body = helper.make_graph(
        [helper.make_node("Cast", ["h"], ["h16"], name="inner_cast", to=F16)], "body", [], [value("h16", F16)]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Cast", ["h"], ["y"], name="not_onnx_cast", domain="com.example", body=body),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [value("x")], [value("y")], [init("W", w(4, 4))]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    m.ir_version = 8
    result = convert(m, level="O3")
    assert (count_casts(m), result.casts_before) == (1, 1)  # the one in the body
    assert result.casts_after == count_casts(result.model)


def test_listed_custom_op_without_declared_output_type_is_converted_and_its_output_declared():
    """Nothing declares the custom op's output type: listing the op says it
    computes in float, so it and the Relu it feeds run low, and the written
    model declares the type it assumed."""
    nodes = [
        helper.make_node("MyOp", ["x"], ["h"], name="custom", domain="com.example"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [value("x")], [value("y")]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    m.ir_version = 8
    _, unlisted = convert(m, level="O2")
    assert unlisted.by_name("relu").rule == "unknown-type"
    out, plan = convert(m, level="O2", white_list=["com.example::MyOp"])
    assert plan.by_name("custom").precision is Precision.LOW and plan.by_name("relu").precision is Precision.LOW
    declared = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    assert declared["h"] == F16
    assert [n.op_type for n in out.graph.node] == ["Cast", "MyOp", "Relu", "Cast"]
    onnx.checker.check_model(out, full_check=True)


# ---------------------------------------------------------------- sources and constants


def test_constants_and_casts_feeding_low_nodes_are_rewritten_in_place():
    nodes = [
        helper.make_node("Constant", [], ["k"], name="const", value=init("kv", w(4, 4))),
        helper.make_node("ConstantOfShape", ["shape"], ["z"], name="cos", value=init("zv", np.array([0.5], np.float32))),
        helper.make_node("Cast", ["ids"], ["idsf"], name="cast", to=F32),
        helper.make_node("Add", ["x", "z"], ["xz"], name="add"),
        helper.make_node("Add", ["xz", "idsf"], ["xzi"], name="add2"),
        helper.make_node("MatMul", ["xzi", "k"], ["y"], name="mm"),
    ]
    m = model(
        nodes,
        [value("x"), value("ids", I64)],
        [value("y")],
        [init("shape", np.array([2, 4], np.int64))],
    )
    out, plan = convert(m, level="O1")
    for name in ("const", "cos", "cast", "add", "add2", "mm"):
        assert plan.by_name(name).precision is Precision.LOW, name
    by_name = {n.name: n for n in out.graph.node}
    assert attr(by_name["const"], "value").data_type == F16
    assert attr(by_name["cos"], "value").data_type == F16
    assert attr(by_name["cast"], "to") == F16
    assert len(nodes_of(out, "Cast")) == 3  # the rewritten one, x in, y out
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32), "ids": np.arange(8, dtype=np.int64).reshape(2, 4) % 3}
    assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_dtype_attribute_of_random_ops_is_rewritten():
    nodes = [
        helper.make_node("RandomNormalLike", ["x"], ["noise"], name="rnd", scale=1e-6),
        helper.make_node("Add", ["x", "noise"], ["h"], name="add"),
        helper.make_node("MatMul", ["h", "W"], ["y"], name="mm"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W", w(4, 4))])
    # onnxruntime has no fp16 kernel for it: it stays fp32 and the model loads and runs.
    out, plan = convert(m, level="O3")
    assert plan.by_name("rnd").rule == "runtime"
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])
    # Forced low, its dtype attribute is what changes (no Cast after it).
    out, plan = convert(m, level="O1", force_low=["^rnd$"])
    assert plan.by_name("rnd").precision is Precision.LOW
    assert attr(next(n for n in out.graph.node if n.name == "rnd"), "dtype") == F16
    assert not casts_into(out, "noise")


def test_initializer_shared_by_low_and_fp32_nodes_keeps_fp32_with_one_cast():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
        helper.make_node("Softmax", ["W"], ["sw"], name="sm"),
        helper.make_node("MatMul", ["a", "sw"], ["y"], name="mm2"),
        helper.make_node("MatMul", ["x", "W"], ["b"], name="mm3"),
    ]
    m = model(nodes, [value("x")], [value("y"), value("b")], [init("W", w(4, 4))])
    out, plan = convert(m, level="O1")
    assert plan.by_name("sm").precision is Precision.FP32
    assert init_type(out, "W") == F32
    assert len(casts_into(out, "W")) == 1  # one fp16 copy, shared by mm and mm3
    assert len(casts_into(out, "x")) == 1
    feeds = x_feed()
    for a, b in zip(run(m, feeds), run(out, feeds), strict=True):
        assert close(a, b)


@pytest.mark.parametrize("form", ["initializer", "constant", "value_floats"])
def test_a_shared_out_of_range_constant_gives_its_low_readers_a_clipped_copy(form):
    """Values beyond fp16 read fp32 by a Softmax and low by a Mul (O2
    without the safety rule): the Mul reads a copy clipped to 65504 and
    counted, an initializer or a Constant alike, not a Cast that makes Inf."""
    big = [1e5, -2e5, 1.0, 2.0]
    nodes = [
        helper.make_node("Mul", ["x", "b"], ["a"], name="mul"),
        helper.make_node("MatMul", ["a", "W"], ["y"], name="mm"),
        helper.make_node("Softmax", ["b"], ["sb"], name="sm"),
    ]
    inits = [init("W", w(4, 4, scale=1e-4))]
    if form == "initializer":
        inits.append(init("b", np.array(big, np.float32)))
    else:
        values = {"value": init("bv", np.array(big, np.float32))} if form == "constant" else {"value_floats": big}
        nodes.insert(0, helper.make_node("Constant", [], ["b"], name="const", **values))
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 4)), value("sb", shape=(4,))], inits)
    result = convert(m, level="O2", safety=False)
    assert result.plan.by_name("mul").precision is Precision.LOW
    assert result.stats.clipped == {"b": 2}
    assert not casts_into(result.model, "b")
    feeds = {"x": np.full((1, 4), 0.25, np.float32)}
    clipped = np.array([65504, -65504, 1, 2], np.float32) * feeds["x"] @ onnx.numpy_helper.to_array(inits[0])
    got = run(result.model, feeds)
    assert np.all(np.isfinite(got[0])) and close(clipped, got[0])
    assert np.array_equal(run(m, feeds)[1], got[1])


def test_a_shared_out_of_range_fill_value_gives_its_low_readers_a_clipped_constant_of_shape():
    """A ConstantOfShape filled with 1e5, read fp32 by a Softmax and low by
    a Mul: the Mul reads a second ConstantOfShape of the same shape, filled
    with 65504 (counted), not a Cast that makes Inf."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill", value=init("v", np.array([1e5], np.float32))),
        helper.make_node("Mul", ["x", "c"], ["a"], name="mul"),
        helper.make_node("MatMul", ["a", "W"], ["y"], name="mm"),
        helper.make_node("Softmax", ["c"], ["sc"], name="sm"),
    ]
    weight = w(4, 4, scale=1e-4)
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 4)), value("sc", shape=(1, 4))], [init("W", weight)])
    result = convert(m, level="O3", keep_fp32=["^sm$"])
    assert result.plan.by_name("mul").precision is Precision.LOW
    assert result.stats.clipped == {"c": 1} and not casts_into(result.model, "c")
    assert len(nodes_of(result.model, "ConstantOfShape")) == 2
    assert result.stats.casts_inserted == len(nodes_of(result.model, "Cast"))  # (the second fill is no Cast)
    feeds = {"x": np.full((1, 4), 0.25, np.float32)}
    got = run(result.model, feeds)
    assert np.all(np.isfinite(got[0])) and close(np.full((1, 4), 65504 * 0.25, np.float32) @ weight, got[0])
    assert np.array_equal(run(m, feeds)[1], got[1])


def test_out_of_range_constant_keeps_its_consumer_fp32_unless_forced():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Mul", ["h", "big"], ["y"], name="scale_up"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W", w(4, 4)), init("big", np.array([1e6], np.float32))])
    out, plan = convert(m, level="O2")
    entry = plan.by_name("scale_up")
    assert entry.precision is Precision.FP32 and entry.rule == "safety-initializer-range"
    assert "beyond float16's max" in entry.reason
    assert init_type(out, "big") == F32
    result = convert(m, level="O2", force_low=["scale_up"])
    assert result.plan.by_name("scale_up").precision is Precision.LOW
    assert result.stats.clipped == {"big": 1}
    assert init_type(result.model, "big") == F16


def test_tiny_epsilon_that_flushes_to_zero_keeps_its_consumer_fp32():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "eps"], ["y"], name="add_eps"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W", w(4, 4)), init("eps", np.array([1e-12], np.float32))])
    _, plan = convert(m, level="O2")
    assert plan.by_name("add_eps").rule == "safety-initializer-range"
    assert "would become 0 in float16" in plan.by_name("add_eps").reason
    _, plan3 = convert(m, level="O3")  # O3 means everything: schema rules only
    assert plan3.by_name("add_eps").precision is Precision.LOW


def test_small_weights_lowered_together_keep_their_values_and_counts():
    """Many small initializers are lowered in one numpy pass; each keeps its
    own values, and values flushed to zero are counted per constant."""
    rng = np.random.default_rng(3)
    weights = {f"W{k}": rng.uniform(-1, 1, (4, 4)).astype(np.float32) for k in range(3)}
    weights["W1"][0, 0] = 1e-9  # flushes to 0 in fp16: counted, not silent
    nodes, x = [], "x"
    for k in range(3):
        nodes.append(helper.make_node("MatMul", [x, f"W{k}"], [f"h{k}"], name=f"mm{k}"))
        x = f"h{k}"
    m = model(nodes, [value("x")], [value(x)], [init(n, a) for n, a in weights.items()])
    result = convert(m, level="O3")
    lowered = {t.name: onnx.numpy_helper.to_array(t) for t in result.model.graph.initializer}
    for name, array in weights.items():
        assert lowered[name].dtype == np.float16
        assert np.array_equal(lowered[name], array.astype(np.float16))
    assert result.stats.flushed == {"W1": 1}
    assert result.stats.initializers_lowered == 3


def test_constant_values_in_the_main_graph_and_in_branches_are_lowered_in_place():
    """Small Constant values are lowered together, in the main graph and in an
    If branch (whose nodes the rewrite re-lists); a flushed value is counted
    under the Constant's output name."""
    k1, k2 = w(4, 4), w(4, 4)
    k2[0, 0] = 1e-9  # flushes to 0 in fp16
    then_g = helper.make_graph(
        [
            helper.make_node("Constant", [], ["k2"], name="branch_const", value=init("k2v", k2)),
            helper.make_node("MatMul", ["h", "k2"], ["t"], name="then_mm"),
        ],
        "then",
        [],
        [value("t")],
    )
    else_g = helper.make_graph([helper.make_node("Relu", ["h"], ["e"], name="else_relu")], "else", [], [value("e")])
    nodes = [
        helper.make_node("Constant", [], ["k1"], name="const", value=init("k1v", k1)),
        helper.make_node("MatMul", ["x", "k1"], ["h"], name="mm"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    m = model(nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, shape=())], [value("y")])
    result = convert(m, level="O3")  # (at O2 the safety rule would keep then_mm fp32 for the flushed value)
    out = result.model
    main_value = attr(next(n for n in out.graph.node if n.name == "const"), "value")
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    then_out = next(a.g for a in if_node.attribute if a.name == "then_branch")
    branch_value = attr(next(n for n in then_out.node if n.name == "branch_const"), "value")
    assert main_value.data_type == F16 and branch_value.data_type == F16
    assert np.array_equal(onnx.numpy_helper.to_array(main_value), k1.astype(np.float16))
    assert np.array_equal(onnx.numpy_helper.to_array(branch_value), k2.astype(np.float16))
    assert result.stats.flushed == {"k2": 1}
    assert result.stats.constants_lowered == 2
    for cond in (True, False):
        feeds = {**x_feed(), "cond": np.array(cond)}
        assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_safety_rule_finds_constants_behind_data_movement():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Reshape", ["big", "shape"], ["big_r"], name="reshape"),
        helper.make_node("Add", ["h", "big_r"], ["y"], name="add"),
    ]
    inits = [init("W", w(4, 4)), init("big", np.full((4, 2), 1e5, np.float32)), init("shape", np.array([2, 4], np.int64))]
    m = model(nodes, [value("x")], [value("y")], inits)
    _, plan = convert(m, level="O2")
    assert plan.by_name("add").rule == "safety-initializer-range"


def _through(op: str) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """Nodes that make ``b`` (4 values, one of them 1e5) out of constants
    through ``op``, from its data or from another of its inputs; and the
    constants (``c`` holds the 1e5)."""
    node, big, ones = helper.make_node, np.array([1e5, 1, 1, 1], np.float32), np.ones(4, np.float32)

    def square(op_node: onnx.NodeProto, shape: tuple, **more: np.ndarray) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
        """c reshaped to ``shape`` (c2), through ``op_node`` (t), back to 4 values."""
        nodes = [node("Reshape", ["c", "shape"], ["c2"]), op_node, node("Reshape", ["t", "flat"], ["b"])]
        return nodes, {"c": big, "shape": np.array(shape), "flat": np.array([4]), **more}

    cases = {
        "Split": ([node("Split", ["c"], ["b", "rest"], axis=0)], {"c": np.concatenate([big, ones])}),
        "GatherElements": ([node("GatherElements", ["c", "i"], ["b"], axis=0)], {"c": big, "i": np.arange(4)}),
        "GatherND": ([node("GatherND", ["c", "i"], ["b"])], {"c": big, "i": np.arange(4).reshape(4, 1)}),
        "Compress": ([node("Compress", ["c", "i"], ["b"], axis=0)], {"c": np.concatenate([big, ones]), "i": np.arange(8) < 4}),
        "Pad": ([node("Pad", ["c", "pads"], ["b"])], {"c": big[:2], "pads": np.array([1, 1])}),
        "Trilu": square(node("Trilu", ["c2"], ["t"]), (2, 2)),
        "ReverseSequence": square(node("ReverseSequence", ["c2", "lengths"], ["t"]), (4, 1), lengths=np.array([4])),
        "DepthToSpace": square(node("DepthToSpace", ["c2"], ["t"], blocksize=2), (1, 4, 1, 1)),
        "SpaceToDepth": square(node("SpaceToDepth", ["c2"], ["t"], blocksize=2), (1, 1, 2, 2)),
        "Concat second input": ([node("Concat", ["one", "c"], ["b"], axis=0)], {"one": ones[:2], "c": big[:2]}),
        "Pad constant_value": (
            [node("Pad", ["one", "pads", "c"], ["b"])],
            {"one": ones[:2], "pads": np.array([1, 1]), "c": big[0]},
        ),
        "ScatterND updates": (
            [node("ScatterND", ["one", "i", "c"], ["b"])],
            {"one": ones, "i": np.zeros((1, 1), int), "c": big[:1]},
        ),
        "Where constant branch": (
            [node("Where", ["keep", "one", "c"], ["b"])],
            {"keep": np.array([False, True, True, True]), "one": ones, "c": big[0]},
        ),
        # (before opset 11 Pad pads with its value attribute: a constant of its own)
        "Pad value attribute": ([node("Pad", ["one"], ["b"], pads=[1, 1], value=1e5)], {"one": ones[:2]}),
    }
    return cases[op]


_THROUGH_OPSETS = {"Pad value attribute": 10}


@pytest.mark.parametrize(
    "op",
    [
        "Split", "GatherElements", "GatherND", "Compress", "Pad", "Trilu", "ReverseSequence", "DepthToSpace",
        "SpaceToDepth", "Concat second input", "Pad constant_value", "ScatterND updates", "Where constant branch",
        "Pad value attribute",
    ],
)  # fmt: skip
def test_safety_rule_finds_constants_behind_every_op_that_passes_values_on(op):
    """A constant of 1e5 reaches a Mul through ``op`` (moving, picking or
    padding values, from its data or from another input): the Mul stays
    fp32 at O2, as behind a Reshape, and the result stays finite where
    every low tensor is rounded (the Mul read Inf behind Where's constant
    branch and Pad's value before opset 11, which the rule did not follow)."""
    made, constants = _through(op)
    nodes = [
        *made,
        helper.make_node("Mul", ["b", "scale"], ["m"], name="mul"),
        helper.make_node("Add", ["x", "m"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "W"], ["y"], name="mm"),
    ]
    inits = [init(name, a.astype(np.int64) if a.dtype.kind == "i" else a) for name, a in constants.items()]
    inits += [init("W", w(4, 4)), init("scale", np.array(1e-5, np.float32))]
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 4))], inits, opset=_THROUGH_OPSETS.get(op, 17))
    out, plan = convert(m, level="O2")
    assert plan.by_name("mul").rule == "safety-initializer-range"
    feeds = x_feed((1, 4))
    assert close(run(m, feeds)[0], run(out, feeds)[0])
    assert close(run(m, feeds)[0], run(emulation_twin(out), feeds)[0])


def test_a_pad_before_opset_11_is_judged_on_the_value_it_pads_with():
    """Before opset 11 Pad holds the value it pads with in an attribute: a
    low Pad of 1e5 made Inf where every low tensor is rounded (as on a GPU).
    At O2 the Pad holding it stays fp32 (the Pad of the same kind before it,
    padding with 0.5, runs low: each is judged on its own value); at O3 the
    value is clipped to fp16's largest, and counted."""
    pads = [0, 1, 0, 1]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Pad", ["h"], ["p1"], name="pad_small", pads=pads, value=0.5),
        helper.make_node("Pad", ["h"], ["p2"], name="pad_big", pads=pads, value=1e5),
        helper.make_node("Mul", ["p2", "scale"], ["m"], name="mul"),
        helper.make_node("Add", ["p1", "m"], ["y"], name="add"),
    ]
    inits = [init("W", w(4, 4)), init("scale", np.array(1e-5, np.float32))]
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 6))], inits, opset=10)
    feeds = x_feed((1, 4))
    out, plan = convert(m, level="O2")
    assert plan.by_name("pad_small").precision is Precision.LOW
    big = plan.by_name("pad_big")
    assert big.rule == "safety-initializer-range" and "the value attribute of Pad 'pad_big'" in big.reason
    assert close(run(m, feeds)[0], run(emulation_twin(out), feeds)[0])
    result = convert(m, level="O3")
    assert attr(next(n for n in result.model.graph.node if n.name == "pad_big"), "value") == 65504.0
    assert result.stats.clipped == {"pad_big.value": 1}
    assert np.isfinite(run(emulation_twin(result.model), feeds)[0]).all()


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_a_pad_before_opset_11_that_pads_with_its_data_holds_no_value(mode):
    """In reflect and edge mode a Pad before opset 11 pads with values of
    its data, not with its ``value`` attribute: a value of 1e5 there keeps
    nothing fp32 at O2, and at O3 is neither clipped nor counted."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Pad", ["h"], ["p"], name="pad", mode=mode, pads=[0, 1, 0, 1], value=1e5),
        helper.make_node("Mul", ["p", "scale"], ["y"], name="mul"),
    ]
    inits = [init("W", w(4, 4)), init("scale", np.array(0.5, np.float32))]
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 6))], inits, opset=10)
    feeds = x_feed((1, 4))
    out, plan = convert(m, level="O2")
    assert plan.by_name("pad").precision is Precision.LOW and plan.by_name("mul").precision is Precision.LOW
    assert close(run(m, feeds)[0], run(emulation_twin(out), feeds)[0])
    result = convert(m, level="O3")
    assert attr(next(n for n in result.model.graph.node if n.name == "pad"), "value") == 1e5
    assert result.stats.clipped == {} and result.stats.attributes_rewritten == 0


@pytest.mark.parametrize(("mode", "opset"), [("reflect", 13), ("edge", 13), ("wrap", 19)])
def test_a_pad_that_pads_with_its_data_is_not_judged_on_its_constant_value(mode, opset):
    """From opset 11 Pad reads the value it pads with from its input
    constant_value, which reflect, edge and wrap never read: a
    constant_value of 1e10 kept such a Pad fp32 at O2, and the Mul reading
    it (the rule followed the value through the Pad). Both run low now, and
    the result matches fp32 where every low tensor is rounded."""
    m = pads_model([mode], opset)
    out, plan = convert(m, level="O2", target_provider="none")  # (CUDA's Pad kernels stop before opset 19)
    assert plan.by_name("pad0").precision is Precision.LOW and plan.by_name("pad0").rule == "follow"
    assert plan.by_name("mul0").precision is Precision.LOW and plan.by_name("mul0").rule == "follow"
    feeds = x_feed((1, 4))
    assert close(run(m, feeds)[0], run(out, feeds)[0])
    assert close(run(m, feeds)[0], run(emulation_twin(out), feeds)[0])


@pytest.mark.parametrize("mode", ["constant", None])
def test_a_pad_in_constant_mode_is_judged_on_its_constant_value(mode):
    """In constant mode (also when the attribute is left out) Pad pads with
    constant_value: 1e10 keeps it fp32 at O2, and the padded values reach
    the output as they are."""
    m = pads_model([mode], 13)
    out, plan = convert(m, level="O2")
    pad = plan.by_name("pad0")
    assert pad.rule == "safety-initializer-range" and "constant 'cv'" in pad.reason
    feeds = x_feed((1, 4))
    assert run(out, feeds)[0][0, 0] == run(m, feeds)[0][0, 0] == 5e9


@pytest.mark.parametrize("modes", [["reflect", "constant"], ["constant", "reflect"]])
def test_pads_of_one_kind_reading_one_constant_value_are_judged_on_their_own_modes(modes):
    """Two Pads of one kind (op and float slots) read the same
    constant_value of 1e10, one of them in constant mode: whichever comes
    first, that one stays fp32 and the other runs low."""
    m = pads_model(modes, 13)
    out, plan = convert(m, level="O2")
    for k, mode in enumerate(modes):
        entry = plan.by_name(f"pad{k}")
        if mode == "constant":
            assert entry.rule == "safety-initializer-range"
        else:
            assert entry.precision is Precision.LOW and entry.rule == "follow"
    feeds = x_feed((1, 4))
    for want, got in zip(run(m, feeds), run(emulation_twin(out), feeds), strict=True):
        assert close(want, got)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_safety_rule_judges_each_node_of_a_repeated_kind_on_its_own_constants(dtype):
    """Nodes of one kind reached by the same states share a worked-out
    outcome; the safety rule must still look at each one's own inputs: here
    the fourth Add of a chain reads 100000 (beyond fp16, not bf16) through
    Constant(int64) -> Cast -> Reshape, and a branch's second Add reads a
    constant beyond both from the outer graph."""
    as_int = np.full((4, 2), 100_000, np.int64)
    nodes = [
        helper.make_node("Constant", [], ["big_i"], name="const", value=onnx.numpy_helper.from_array(as_int)),
        helper.make_node("Cast", ["big_i"], ["big_f"], name="cast", to=F32),
        helper.make_node("Reshape", ["big_f", "shape"], ["big_r"], name="reshape"),
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
    ]
    inits = [init("shape", np.array([2, 4], np.int64)), init("W", w(4, 4))]
    inits.append(init("huge", np.full((2, 4), 3.395e38, np.float32)))  # beyond bf16's largest (3.39e38) too
    x = "a"
    for i in range(4):
        inits.append(init(f"b{i}", w(2, 4)))
        nodes.append(helper.make_node("Add", [x, f"b{i}" if i < 3 else "big_r"], [f"a{i}"], name=f"add{i}"))
        x = f"a{i}"
    branch_nodes = [
        helper.make_node("MatMul", ["x", "W"], ["t"], name="then_mm"),
        helper.make_node("Add", ["t", "b0"], ["t0"], name="then_add0"),
        helper.make_node("Add", ["t0", "huge"], ["t1"], name="then_add1"),
    ]
    then_g = helper.make_graph(branch_nodes, "then", [], [value("t1")])
    else_g = helper.make_graph([helper.make_node("Identity", ["a3"], ["e"], name="else_id")], "else", [], [value("e")])
    nodes.append(helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g))
    m = model(nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, [])], [value("y")], inits)
    _, plan = convert(m, level="O2", dtype=dtype)
    kept = {e.name for e in plan if e.rule == "safety-initializer-range"}
    assert kept == ({"add3", "then_add1"} if dtype == "fp16" else {"then_add1"})
    assert all(plan.by_name(f"add{i}").precision is Precision.LOW for i in range(3))
    assert plan.by_name("then_add0", graph="if/then_branch").precision is Precision.LOW


def test_repeated_kind_with_low_outputs_hands_their_state_on():
    """A node of a repeated kind whose output is already fp16 (its outcome
    reused from the first such node) still tells its readers their input
    is low: the follow node reading it and an fp32 tensor sees mixed
    inputs, as it does when the kinds differ."""
    nodes = [
        helper.make_node("Relu", ["x16"], ["a"], name="relu_a"),
        helper.make_node("Relu", ["x16"], ["b"], name="relu_b"),  # (the same kind: the first one's outcome)
        helper.make_node("Softmax", ["x"], ["s"], name="softmax"),  # (black list: an fp32 tensor)
        helper.make_node("CastLike", ["s", "b"], ["y"], name="like"),
    ]
    m = model(nodes, [value("x16", F16), value("x")], [value("a", F16), value("y", F16)])
    _, plan = convert(m, level="O2")
    assert plan.by_name("relu_b").precision is Precision.UNCHANGED
    assert "mixed fp32/low inputs" in plan.by_name("like").reason


def test_two_control_flow_nodes_of_one_name_get_a_plan_and_safety_rule_each():
    """Node names need not be unique: each body gets a path of its own, so
    neither its plan nor its constants' statistics are taken for the other's."""

    def branch(weight: str, tag: str) -> onnx.GraphProto:
        nodes = [
            helper.make_node("MatMul", ["x", "W"], [f"m_{tag}"], name=f"mm_{tag}"),
            helper.make_node("Add", [f"m_{tag}", weight], [f"o_{tag}"], name=f"add_{tag}"),
        ]
        return helper.make_graph(nodes, f"b_{tag}", [], [value(f"o_{tag}")])

    nodes = [
        helper.make_node("If", ["cond"], [f"y{k}"], name="cond_if", then_branch=branch(w_, a), else_branch=branch(w_, b))
        for k, (w_, a, b) in enumerate((("small", "a", "b"), ("big", "c", "d")), 1)
    ]
    inits = [init("W", w(4, 4)), init("small", w(2, 4)), init("big", np.full((2, 4), 1e6, np.float32))]
    m = model(nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, [])], [value("y1"), value("y2")], inits)
    _, plan = convert(m, level="O2")
    paths = [p for p in plan.entries if p]
    assert len(paths) == 4 and len(set(paths)) == 4
    by_name = {e.name: e for e in plan}
    assert by_name["add_a"].precision is Precision.LOW and by_name["add_b"].precision is Precision.LOW
    assert by_name["add_c"].rule == by_name["add_d"].rule == "safety-initializer-range"


def test_safety_rules_keep_nothing_fp32_on_a_well_behaved_model():
    _, plan = convert(mm_chain(("Relu", "Neg")), level="O2")
    assert not [e for e in plan if e.rule.startswith("safety")]


# ---------------------------------------------------------------- casts and clean-up


def test_one_cast_per_tensor_per_dtype_shared_by_consumers():
    nodes = [helper.make_node("MatMul", ["x", f"W{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)]
    m = model(nodes, [value("x")], [value(f"y{i}") for i in range(3)], [init(f"W{i}", w(4, 4)) for i in range(3)])
    out, _ = convert(m, level="O1")
    assert len(casts_into(out, "x")) == 1
    assert len(nodes_of(out, "Cast")) == 4


def test_partly_fp16_model_gets_no_cast_chains():
    nodes = [
        helper.make_node("Cast", ["x16"], ["x32"], name="up"),
        helper.make_node("MatMul", ["x32", "W"], ["h"], name="mm"),
        helper.make_node("Softmax", ["x32"], ["y2"], name="sm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    nodes[0].attribute.append(helper.make_attribute("to", F32))
    m = model(nodes, [value("x16", F16)], [value("y"), value("y2")], [init("W", w(4, 4))])
    out, plan = convert(m, level="O1")
    assert plan.by_name("up").precision is Precision.FP32  # Softmax still needs fp32
    mm = next(n for n in out.graph.node if n.name == "mm")
    assert mm.input[0] == "x16"  # the fp16 -> fp32 -> fp16 round trip was removed
    assert len(nodes_of(out, "Cast")) == 2  # the original up-cast and y's output cast
    feeds = {"x16": RNG.standard_normal((2, 4)).astype(np.float16)}
    for a, b in zip(run(m, feeds), run(out, feeds), strict=True):
        assert close(a, b)


def test_cast_to_float_of_fp16_data_disappears_when_its_consumers_run_low():
    nodes = [
        helper.make_node("Cast", ["x16"], ["x32"], name="up", to=F32),
        helper.make_node("MatMul", ["x32", "W"], ["y"], name="mm"),
    ]
    m = model(nodes, [value("x16", F16)], [value("y")], [init("W", w(4, 4))])
    out, _ = convert(m, level="O1")
    assert not any(n.name == "up" for n in out.graph.node)
    assert next(n for n in out.graph.node if n.name == "mm").input[0] == "x16"


def test_exact_cast_pair_of_the_original_model_leaves_no_dead_cast():
    """fp16 -> fp32 -> fp16 in the original: both Casts go once the second is
    bypassed (the first had no other reader)."""
    nodes = [
        helper.make_node("Cast", ["x16"], ["x32"], name="up", to=F32),
        helper.make_node("Cast", ["x32"], ["back"], name="down", to=F16),
        helper.make_node("Relu", ["back"], ["y"], name="relu"),
    ]
    m = model(nodes, [value("x16", F16)], [value("y", F16)])
    out, _ = convert(m, level="O2")
    assert not nodes_of(out, "Cast")
    assert nodes_of(out, "Relu")[0].input[0] == "x16"
    feeds = {"x16": RNG.standard_normal((2, 4)).astype(np.float16)}
    np.testing.assert_array_equal(run(m, feeds)[0], run(out, feeds)[0])


def test_lossy_cast_pair_of_the_original_model_is_kept():
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="down", to=F16),
        helper.make_node("Cast", ["x16"], ["xq"], name="up", to=F32),
        helper.make_node("Softmax", ["xq"], ["y"], name="sm"),
    ]
    m = model(nodes, [value("x")], [value("y")])
    out, _ = convert(m, level="O1")
    assert [n.name for n in nodes_of(out, "Cast")] == ["down", "up"]


def test_graph_outputs_keep_name_and_type_and_node_outputs_keep_names():
    m = mm_chain(("Relu",))
    out, _ = convert(m, level="O3")
    assert [(v.name, v.type.tensor_type.elem_type) for v in out.graph.output] == [("y", F32)]
    assert [(v.name, v.type.tensor_type.elem_type) for v in out.graph.input] == [("x", F32)]
    produced = {o for n in out.graph.node for o in n.output}
    assert {"h0", "h1", "y"} <= produced
    mm2 = next(n for n in out.graph.node if n.name == "mm2")
    assert mm2.output[0] == "y_fp16"


def test_io_types_low_makes_inputs_and_outputs_low():
    out, _ = convert(mm_chain(("Relu",)), level="O3", io_types="low")
    assert out.graph.input[0].type.tensor_type.elem_type == F16
    assert out.graph.output[0].type.tensor_type.elem_type == F16
    assert not nodes_of(out, "Cast")


def test_converted_nodes_are_in_topological_order():
    out, _ = convert(mm_chain(("Softmax", "Relu")), level="O1")
    seen = {"x", "W1", "W2"}
    for node in out.graph.node:
        assert all(i in seen for i in node.input if i)
        seen.update(node.output)


@pytest.mark.parametrize("blocks", [3, 200])
def test_casts_are_placed_in_order_whether_inserted_or_relisted(blocks):
    """A few new Casts are inserted where they go; many (here 2 x 200
    around 200 black-listed Softmax nodes) make the node list anew. Either
    way: every node of the input is there once, each Cast right after its
    source's producer, and the graph is valid and runs."""
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        inits.append(init(f"W{i}", w(4, 4)))
        nodes += [
            helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
            helper.make_node("Softmax", [f"h{i}"], [f"s{i}"], name=f"sm{i}", axis=-1),
        ]
        x = f"s{i}"
    m = model(nodes, [value("x")], [value(x)], inits)
    out, _ = convert(m, level="O2")
    onnx.checker.check_model(out, full_check=True)
    names = [n.name for n in out.graph.node]
    assert [n for n in names if not n.endswith("_cast")] == [n.name for n in m.graph.node]
    casts = nodes_of(out, "Cast")
    assert len(casts) == 2 * blocks  # the graph input, into each Softmax, out of each but the last (the output)
    produced_at = {o: k for k, n in enumerate(out.graph.node) for o in n.output}
    for cast in casts:
        source = cast.input[0]
        at = names.index(cast.name)
        assert (source == "x" and at < blocks) or produced_at[source] < at  # after its source (graph input Casts first)
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


# ---------------------------------------------------------------- subgraphs


def if_model():
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W2"], ["t"], name="then_mm")], "then", [], [value("t")], [init("W2", w(4, 4))]
    )
    else_g = helper.make_graph([helper.make_node("Softmax", ["h"], ["e"], name="else_sm")], "else", [], [value("e")])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    return model(nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, shape=())], [value("y")], [init("W", w(4, 4))])


def test_if_branches_are_converted_with_outer_scope_values():
    m = if_model()
    out, plan = convert(m, level="O1")
    assert plan.entry("if/then_branch", 0).precision is Precision.LOW
    assert plan.entry("if/else_branch", 0).precision is Precision.FP32
    assert plan.by_name("if").rule == "control-flow"
    then_g = next(a.g for a in next(n for n in out.graph.node if n.op_type == "If").attribute if a.name == "then_branch")
    assert then_g.node[-1].op_type == "Cast"  # the branch output keeps fp32
    assert init_type(onnx.ModelProto(graph=then_g), "W2") == F16
    for cond in (True, False):
        feeds = {**x_feed(), "cond": np.array(cond)}
        assert close(run(m, feeds)[0], run(out, feeds)[0])


def low_if_model():
    """Both branches end in a low MatMul; the If's result feeds another MatMul."""
    branches = {
        key: helper.make_graph(
            [helper.make_node("MatMul", ["h", f"W_{key}"], [f"o_{key}"], name=f"{key}_mm")],
            key,
            [],
            [value(f"o_{key}")],
            [init(f"W_{key}", w(4, 4))],
        )
        for key in ("then", "else")
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branches["then"], else_branch=branches["else"]),
        helper.make_node("MatMul", ["y", "W"], ["z"], name="after"),
    ]
    inputs = [value("x"), value("cond", onnx.TensorProto.BOOL, shape=())]
    return model(nodes, inputs, [value("z"), value("y")], [init("W", w(4, 4))])


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_if_output_is_low_when_every_branch_produces_it_low(level):
    m = low_if_model()
    out, plan = convert(m, level=level)
    entry = plan.by_name("if")
    assert (entry.precision, entry.rule, entry.low_outputs) == (Precision.LOW, "control-flow", (0,))
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    for a in if_node.attribute:  # no Cast back to fp32 at the end of a branch; the branch hands on fp16
        assert [n.op_type for n in a.g.node] == ["MatMul"]
        assert a.g.output[0].type.tensor_type.elem_type == F16
    # One Cast for the graph output y (it keeps fp32), none between the If and the low MatMul after it.
    assert [c.output[0] for c in nodes_of(out, "Cast") if c.input[0] == if_node.output[0]] == ["y"]
    after = next(n for n in out.graph.node if n.name == "after")
    assert after.input[0] == if_node.output[0]
    assert elem_types(out)["y"] == F32
    for cond in (True, False):
        feeds = {**x_feed(), "cond": np.array(cond)}
        for ref, got in zip(run(m, feeds), run(out, feeds), strict=True):
            assert close(ref, got)


def test_if_output_stays_fp32_when_a_branch_produces_it_fp32():
    m = low_if_model()
    out, plan = convert(m, level="O2", keep_fp32=["^else_mm$"])
    assert plan.by_name("if").precision is Precision.FP32
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    then_g = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert then_g.node[-1].op_type == "Cast" and then_g.output[0].type.tensor_type.elem_type == F32


def test_loop_body_is_converted():
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v_in", "W"], ["v_mm"], name="body_mm"),
            helper.make_node("Tanh", ["v_mm"], ["v_out"], name="body_tanh"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
        ],
        "body",
        [value("i", I64, shape=()), value("cond_in", onnx.TensorProto.BOOL, shape=()), value("v_in")],
        [value("cond_out", onnx.TensorProto.BOOL, shape=()), value("v_out")],
    )
    nodes = [helper.make_node("Loop", ["trip", "", "x"], ["y"], name="loop", body=body)]
    m = model(nodes, [value("x")], [value("y")], [init("W", w(4, 4)), init("trip", np.array(3, np.int64))])
    out, plan = convert(m, level="O1")
    assert plan.entry("loop/body", 0).precision is Precision.LOW
    assert plan.entry("loop/body", 1).precision is Precision.LOW  # Tanh follows the low MatMul
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_scan_body_is_converted_and_reads_the_outer_weight_low(dtype):
    """Scan over the rows of x: state <- state + Tanh(row @ W), W captured
    from the main graph. The body's MatMul runs low, the Scan keeps its fp32
    interface, and W (read only low) is lowered once, outside the body."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["row", "W"], ["proj"], name="body_mm"),
            helper.make_node("Tanh", ["proj"], ["act"], name="body_tanh"),
            helper.make_node("Add", ["state_in", "act"], ["state_out"], name="body_add"),
            helper.make_node("Identity", ["state_out"], ["step"], name="body_step"),
        ],
        "body",
        [value("state_in", shape=(4,)), value("row", shape=(4,))],
        [value("state_out", shape=(4,)), value("step", shape=(4,))],
    )
    nodes = [helper.make_node("Scan", ["s0", "x"], ["final", "y"], name="scan", body=body, num_scan_inputs=1)]
    m = model(
        nodes,
        [value("x", shape=(3, 4))],
        [value("final", shape=(4,)), value("y", shape=(3, 4))],
        [init("W", w(4, 4)), init("s0", np.zeros(4, np.float32))],
    )
    out, plan = convert(m, level="O1", dtype=dtype)
    onnx.checker.check_model(out, full_check=True)
    assert plan.by_name("scan").rule == "control-flow"
    assert plan.by_name("body_mm", "scan/body").precision is Precision.LOW
    assert plan.by_name("body_tanh", "scan/body").precision is Precision.LOW  # follows the low MatMul
    low = F16 if dtype == "fp16" else BF16
    assert init_type(out, "W") == low and init_type(out, "s0") == F32  # the state keeps the Scan's fp32 interface
    body_out = attr(nodes_of(out, "Scan")[0], "body")
    casts = [n for n in body_out.node if n.op_type == "Cast"]
    # Casts only at the body's fp32 interface: its inputs cast down, its outputs cast back.
    interface = {v.name for v in (*body_out.input, *body_out.output)}
    assert casts and all(c.input[0] in interface or c.output[0] in interface for c in casts)
    assert [v.type.tensor_type.elem_type for v in out.graph.output] == [F32, F32]
    if dtype == "fp16":
        feeds = x_feed((3, 4))
        for a, b in zip(run(m, feeds), run(out, feeds), strict=True):
            assert close(a, b)


# ---------------------------------------------------------------- options


def test_options_are_validated():
    with pytest.raises(ValueError, match="unknown `level`"):
        ConvertOptions(level="O7").validated()
    with pytest.raises(ValueError, match="unsupported dtype"):
        ConvertOptions(dtype="fp8").validated()
    with pytest.raises(ValueError, match="both"):
        ConvertOptions(white_list=("Conv",), black_list=("Conv",)).validated()
    with pytest.raises(ValueError, match="unknown ONNX op type 'Cnov'"):
        ConvertOptions(white_list=("Cnov",)).validated()
    with pytest.raises(ValueError, match="invalid regular expression"):
        ConvertOptions(keep_fp32=("(",)).validated()
    with pytest.raises(ValueError, match="cannot be used with `level` O3"):
        ConvertOptions(level="O3", only_white_list=("Conv",)).validated()


def test_the_callers_model_is_not_modified():
    m = mm_chain(("Relu",))
    before = m.SerializeToString()
    convert(m, level="O3")
    assert m.SerializeToString() == before


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_tensors_into_and_out_of_sequences_keep_their_type(level):
    """SplitToSequence / ConcatFromSequence: the sequence's element type is not
    tracked, so the float32 tensors on either side stay float32."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
        helper.make_node("SplitToSequence", ["h"], ["sq"], name="split", axis=0),
        helper.make_node("ConcatFromSequence", ["sq"], ["cc"], name="concat", axis=0),
        helper.make_node("MatMul", ["cc", "W"], ["y"], name="mm2"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W", w(4, 4))])
    out, plan = convert(m, level=level)
    assert plan.by_name("split").rule == "unknown-type"  # a float32 tensor into a sequence stays float32
    assert plan.by_name("mm1").precision is Precision.LOW
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_a_source_read_by_an_fp32_node_stays_fp32_at_o2():
    """Cast(int64 positions -> float) feeds a black-listed Sin and a low Add:
    lowering it would round position 3001 to 3000 before the Sin."""
    nodes = [
        helper.make_node("Cast", ["pos"], ["posf"], name="to_float", to=F32),
        helper.make_node("Sin", ["posf"], ["s"], name="sin"),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "posf"], ["y"], name="add"),
    ]
    m = model(nodes, [value("x"), value("pos", I64)], [value("y"), value("s")], [init("W", w(4, 4))])
    out, plan = convert(m, level="O2")
    assert plan.by_name("sin").precision is Precision.FP32
    assert plan.by_name("to_float").precision is Precision.FP32
    assert "a consumer needs fp32" in plan.by_name("to_float").reason
    assert plan.by_name("add").precision is Precision.LOW
    feeds = {**x_feed(), "pos": np.arange(3001, 3009, dtype=np.int64).reshape(2, 4)}
    ref, got = run(m, feeds), run(out, feeds)
    assert np.max(np.abs(ref[1] - got[1])) < 1e-5  # Sin saw the exact positions


@pytest.mark.parametrize("form", ["initializer", "constant"])
def test_a_cast_to_another_type_than_the_low_one_reads_a_constants_fp32_values(form):
    """A weight read by a low MatMul and by Casts to int64, double and
    float32 (into a black-listed Softmax) stays fp32 for the Casts: its
    fp16 version would turn 2049 into 2048. A Cast to fp16 may read it low."""
    weights = np.array([[2049, 1.0001], [0.1234567, 4097]], np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
        helper.make_node("Cast", ["W"], ["wi"], name="to_int", to=I64),
        helper.make_node("Cast", ["W"], ["wd"], name="to_double", to=onnx.TensorProto.DOUBLE),
        helper.make_node("Cast", ["W"], ["wf"], name="to_float", to=F32),
        helper.make_node("Softmax", ["wf"], ["sm"], name="sm"),
        helper.make_node("Cast", ["W"], ["wh"], name="to_half", to=F16),
    ]
    inits = [init("W", weights)]
    if form == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["W"], name="const", value=init("Wv", weights)))
        inits = []
    outputs = [value("y", shape=(1, 2)), value("wi", I64, (2, 2)), value("wd", onnx.TensorProto.DOUBLE, (2, 2))]
    outputs += [value("sm", shape=(2, 2)), value("wh", F16, (2, 2))]
    m = model(nodes, [value("x", shape=(1, 2))], outputs, inits)
    out, plan = convert(m, level="O1")
    assert plan.by_name("mm").precision is Precision.LOW
    feeds = {"x": np.ones((1, 2), np.float32)}
    ref, got = run(m, feeds), run(out, feeds)
    assert close(ref[0], got[0])
    for k in (1, 2, 3, 4):
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k]), outputs[k].name


@pytest.mark.parametrize("form", ["value_float", "value_floats", "constant_of_shape"])
def test_safety_rule_reads_every_form_of_constant(form):
    """A scale of 1e5 held as value_float(s) or a ConstantOfShape value keeps
    its Mul fp32 at O2, as the same value in an initializer does."""
    if form == "constant_of_shape":
        const = helper.make_node("ConstantOfShape", ["shape"], ["k"], name="k", value=init("kv", np.array([1e5], np.float32)))
        inits = [init("W", w(4, 4)), init("shape", np.array([4], np.int64))]
    else:
        values = {"value_float": 1e5, "value_floats": [1e5, 1.0, 1.0, 1.0]}[form]
        const = helper.make_node("Constant", [], ["k"], name="k", **{form: values})
        inits = [init("W", w(4, 4))]
    nodes = [
        const,
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Mul", ["h", "k"], ["y0"], name="scale"),
        helper.make_node("MatMul", ["y0", "W"], ["y"], name="mm2"),
    ]
    m = model(nodes, [value("x")], [value("y")], inits)
    result = convert(m, level="O2")
    assert result.plan.by_name("scale").rule == "safety-initializer-range"
    assert result.stats.clipped == {}
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(result.model, feeds)[0])


def test_a_nan_in_a_weight_does_not_hide_its_other_values_from_clipping():
    weights = np.array([[1e6, 1, 1e-9, 0], [1, 1, 1, 1], [1, 1, 1, 1], [5, 5, np.nan, -1e6]], np.float32)
    m = model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [value("x")], [value("y")], [init("W", weights)])
    result = convert(m, level="O3")
    stored = onnx.numpy_helper.to_array(next(t for t in result.model.graph.initializer if t.name == "W"))
    assert result.stats.clipped == {"W": 2} and result.stats.flushed == {"W": 1}
    assert stored[0, 0] == 65504 and stored[3, 3] == -65504 and np.isnan(stored[3, 2])


def test_qdq_quantized_computation_is_left_as_it_is():
    """DequantizeLinear -> Conv -> QuantizeLinear is what onnxruntime fuses into
    QLinearConv: the Conv between them stays fp32 at every level."""
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], name="dq_w"),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"], name="q"),
        helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"], name="dq_y"),
    ]
    inits = [
        init("wq", np.ones((2, 2, 1, 1), np.uint8)),
        init("s", np.array(0.1, np.float32)),
        init("z", np.array(0, np.uint8)),
    ]
    xq = helper.make_tensor_value_info("xq", onnx.TensorProto.UINT8, [1, 2, 4, 4])
    m = model(nodes, [xq], [value("y", shape=(1, 2, 4, 4))], inits)
    for level in ("O1", "O2", "O3"):
        out, plan = convert(m, level=level)
        assert plan.by_name("conv").rule == "quantized", level
        assert not nodes_of(out, "Cast"), level


def test_sparse_constant_is_left_fp32_and_the_model_stays_valid():
    values = init("vals", np.array([2.0, 3.0], np.float32))
    indices = init("idx", np.array([0, 5], np.int64))
    sparse = helper.make_sparse_tensor(values, indices, [4, 4])
    nodes = [
        helper.make_node("Constant", [], ["k"], name="sparse_k", sparse_value=sparse),
        helper.make_node("MatMul", ["x", "k"], ["y"], name="mm"),
    ]
    m = model(nodes, [value("x")], [value("y")])
    out, plan = convert(m, level="O3")  # (convert runs the full checker on its result)
    assert plan.by_name("sparse_k").rule == "sparse-constant"
    assert plan.by_name("mm").precision is Precision.LOW
    feeds = x_feed()
    assert close(run(m, feeds)[0], run(out, feeds)[0])


def test_a_captured_value_is_cast_once_in_its_own_scope():
    """x is read low inside both branches of an If nested in another If: one
    Cast in the main graph serves all three bodies."""
    inner_then = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["a"], name="in_mm")], "it", [], [value("a")])
    inner_else = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["b"], name="in_mm2")], "ie", [], [value("b")])
    outer_then = helper.make_graph(
        [helper.make_node("If", ["c2"], ["t"], name="inner_if", then_branch=inner_then, else_branch=inner_else)],
        "ot",
        [],
        [value("t")],
    )
    outer_else = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["e"], name="out_mm")], "oe", [], [value("e")])
    nodes = [helper.make_node("If", ["c1"], ["y"], name="outer_if", then_branch=outer_then, else_branch=outer_else)]
    bool_in = [value(c, onnx.TensorProto.BOOL, shape=()) for c in ("c1", "c2")]
    m = model(nodes, [value("x"), *bool_in], [value("y")], [init("W", w(4, 4))])
    out, _ = convert(m, level="O2")

    def all_nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from all_nodes(a.g)

    casts_of_x = [n.name for n in all_nodes(out.graph) if n.op_type == "Cast" and n.input[0] == "x"]
    assert len(casts_of_x) == 1 and casts_of_x[0] in {n.name for n in out.graph.node}  # in the main graph
    for c1 in (True, False):
        for c2 in (True, False):
            feeds = {**x_feed(), "c1": np.array(c1), "c2": np.array(c2)}
            assert close(run(m, feeds)[0], run(out, feeds)[0])


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_new_nodes_never_take_the_name_of_a_node_the_model_has(dtype):
    """The Cast making x's low copy would be named x_<low>_cast, and the one
    making y's fp32 copy m_fp32_cast; the model's own nodes hold those names
    (onnxruntime refuses two nodes of one name), so the new ones get others."""
    low = "fp16" if dtype == "fp16" else "bf16"
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m"], name=f"x_{low}_cast"),
        helper.make_node("Softmax", ["m"], ["s"], name="m_fp32_cast", axis=-1),
        helper.make_node("MatMul", ["s", "W2"], ["y"], name="mm2"),
    ]
    m = model(nodes, [value("x")], [value("y")], [init("W1", w(4, 4)), init("W2", w(4, 4))])
    out = convert(m, level="O2", dtype=dtype).model
    names = [n.name for n in out.graph.node]
    assert len(names) == len(set(names))
    assert {f"x_{low}_cast", "m_fp32_cast", "mm2"} <= set(names)
    assert len(nodes_of(out, "Cast")) == 4  # x in, m to the Softmax, s out of it, y out
    if dtype == "fp16":  # (onnxruntime loads it: no two nodes of one name)
        feed = x_feed()
        assert close(run(out, feed)[0], run(m, feed)[0])


def test_a_value_info_entry_no_tensor_has_does_not_contradict_the_new_tensor_of_its_name():
    """value_info entries for h_fp16 and, in a branch, t_fp16 (float32, of
    another shape) that no node writes, left over by an editing tool: the
    Casts making h's and t's fp16 copies take those free names, and the
    stale entries go (they would contradict them: the checker refused it)."""
    then_g = helper.make_graph(
        [helper.make_node("Exp", ["h"], ["t"], name="exp2"), helper.make_node("MatMul", ["t", "W"], ["o"], name="mm2")],
        "then",
        [],
        [value("o")],
        value_info=[value("t_fp16", shape=(3, 3))],
    )
    else_g = helper.make_graph([helper.make_node("Relu", ["h"], ["e"], name="relu")], "else", [], [value("e")])
    nodes = [
        helper.make_node("Exp", ["x"], ["h"], name="exp"),
        helper.make_node("MatMul", ["h", "W"], ["a"], name="mm"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    m = model(nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, shape=())], [value("y"), value("a")], [init("W", w(4, 4))])
    m.graph.value_info.append(value("h_fp16", shape=(3, 3)))
    onnx.checker.check_model(m, full_check=True)
    out = convert(m, level="O1").model  # (fully checked)
    then_out = next(a.g for a in nodes_of(out, "If")[0].attribute if a.name == "then_branch")
    assert {n.output[0] for n in out.graph.node if n.op_type == "Cast"} >= {"h_fp16"}
    assert "t_fp16" in {n.output[0] for n in then_out.node if n.op_type == "Cast"}
    assert "h_fp16" not in {v.name for v in out.graph.value_info}
    assert "t_fp16" not in {v.name for v in then_out.value_info}
    for cond in (True, False):
        feeds = {"x": RNG.uniform(-1, 1, (2, 4)).astype(np.float32), "cond": np.array(cond)}
        for a, b in zip(run(m, feeds), run(out, feeds), strict=True):
            assert close(a, b)


# ------------------------------------------------------- ops shaped like their input


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("op, attrs", [("RandomNormalLike", {"scale": 0.01}), ("EyeLike", {}), ("EyeLike", {"dtype": F32})])
def test_an_op_shaped_like_a_low_tensor_reads_it_as_its_schema_and_its_type_rule_need(op, attrs, dtype):
    """EyeLike and Random*Like stay fp32 (onnxruntime has no low kernel).
    Without a dtype attribute their output takes their input's type, and
    before opset 22 their input admits no bfloat16: fed a low tensor as it
    is, the output would be low while the plan says fp32 (a Cast of an fp16
    tensor to fp16 followed), or the model invalid. Their input is read fp32."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node(op, ["m"], ["r"], name="like", **attrs),
        helper.make_node("Add", ["m", "r"], ["y"], name="add"),
    ]
    m = model(nodes, [value("x", shape=(4, 4))], [value("y", shape=(4, 4))], [init("W", w(4, 4))])
    out, plan = convert(m, level="O2", dtype=dtype)  # (the full check runs, types included)
    assert plan.by_name("like").precision is Precision.FP32
    types = elem_types(out)
    assert types["r"] == F32
    low = F16 if dtype == "fp16" else BF16
    for cast in nodes_of(out, "Cast"):  # (no Cast to a type its input already has)
        assert types[cast.input[0]] != attr(cast, "to")
    like = next(n for n in out.graph.node if n.name == "like")
    assert types[like.input[0]] == F32 and types["m"] == low
    if dtype == "fp16" and op == "EyeLike":
        feed = {"x": RNG.standard_normal((4, 4)).astype(np.float32)}
        assert close(run(out, feed)[0], run(m, feed)[0])


@pytest.mark.parametrize(
    "opset, dtype, low_if", [(13, "bf16", False), (15, "bf16", False), (16, "bf16", True), (13, "fp16", True)]
)
def test_an_if_hands_on_low_outputs_only_where_its_schema_admits_the_low_type(opset, dtype, low_if):
    """Both branches end in a MatMul: the If may hand their low results on,
    except where its schema has no place for the low type (bfloat16 before
    opset 16), where each branch casts back to fp32 as the If's outputs were."""
    branch = [
        helper.make_graph([helper.make_node("MatMul", ["x", w_name], [out])], name, [], [value(out, shape=(4, 4))])
        for w_name, out, name in (("W1", "t", "then"), ("W2", "e", "else"))
    ]
    nodes = [
        helper.make_node("If", ["c"], ["h"], name="if", then_branch=branch[0], else_branch=branch[1]),
        helper.make_node("MatMul", ["h", "W3"], ["y"], name="mm"),
    ]
    inputs = [value("x", shape=(4, 4)), value("c", onnx.TensorProto.BOOL, shape=())]
    m = model(nodes, inputs, [value("y", shape=(4, 4))], [init(n, w(4, 4)) for n in ("W1", "W2", "W3")], opset=opset)
    out, plan = convert(m, level="O2", dtype=dtype)  # (the full check runs, types included)
    assert (plan.by_name("if").precision is Precision.LOW) == low_if
    low = F16 if dtype == "fp16" else BF16
    assert elem_types(out)["h"] == (low if low_if else F32)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_sibling_branches_may_each_define_a_tensor_of_one_name(level):
    """Both branches name a tensor t: a float Softmax in one, an int64 Shape
    in the other, cast to float there. Each branch's types are its own: the
    Cast of the int64 t is no Cast of a float to float, and stays (where it
    was removed, the model failed the checker)."""
    then = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["t"], axis=-1), helper.make_node("MatMul", ["t", "W"], ["o1"])],
        "then",
        [],
        [value("o1", shape=(4, 4))],
    )
    other = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["t"]),
            helper.make_node("Cast", ["t"], ["tf"], to=F32),
            helper.make_node("ReduceSum", ["tf"], ["rs"], keepdims=1),
            helper.make_node("Expand", ["rs", "t"], ["o2"]),
        ],
        "else",
        [],
        [value("o2", shape=(4, 4))],
    )
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)]
    inputs = [value("x", shape=(4, 4)), value("c", onnx.TensorProto.BOOL, shape=())]
    m = model(nodes, inputs, [value("y", shape=(4, 4))], [init("W", w(4, 4))])
    out, _ = convert(m, level=level)  # (the full check runs)
    branches = {a.name: a.g for n in out.graph.node if n.op_type == "If" for a in n.attribute}
    casts = [n for n in branches["else_branch"].node if n.op_type == "Cast" and n.input[0] == "t"]
    assert [attr(n, "to") for n in casts] == [F16 if level == "O3" else F32]  # (at O3 it casts to fp16 itself)
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        assert close(run(out, feed)[0], run(m, feed)[0])


@pytest.mark.parametrize("nested_w", ["reads the branch's", "its own"])
def test_a_branch_initializer_named_as_an_outer_one_of_another_type_gets_a_name_of_its_own(nested_w):
    """A branch's weight W shadows the main graph's W: the branch's runs low,
    the outer one stays fp32 for a Softmax. onnx's type inference would take
    the outer type for the inner name (the full check failed): the inner W
    is renamed, in the branch and in the body within it that reads it; a W
    of that body's own then shadows the outer W: it is renamed too."""
    inner_w = w(4, 4, scale=3)
    own = [init("W", w(4, 4))] if nested_w == "its own" else []
    nested = helper.make_graph([helper.make_node("MatMul", ["t", "W"], ["n"])], "nested_then", [], [value("n")], own)
    nested_else = helper.make_graph([helper.make_node("Relu", ["t"], ["ne"])], "nested_else", [], [value("ne")])
    then_g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["t"], name="inner_mm"),
            helper.make_node("If", ["c"], ["tn"], name="nested_if", then_branch=nested, else_branch=nested_else),
        ],
        "then",
        [],
        [value("tn")],
        [init("W", inner_w)],
    )
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [value("e")])
    nodes = [
        helper.make_node("If", ["c"], ["r"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Softmax", ["W"], ["ws"], name="sm"),
        helper.make_node("Add", ["r", "x"], ["y0"], name="add"),
        helper.make_node("MatMul", ["y0", "ws"], ["y"], name="mm"),
    ]
    inputs = [value("x"), value("c", onnx.TensorProto.BOOL, shape=())]
    m = model(nodes, inputs, [value("y")], [init("W", w(4, 4))])
    out, plan = convert(m, level="O1")  # (the full check runs)
    assert plan.by_name("inner_mm", "if/then_branch").precision is Precision.LOW
    assert init_type(out, "W") == F32
    then_out = next(a.g for a in nodes_of(out, "If")[0].attribute if a.name == "then_branch")
    (inner,) = then_out.initializer
    assert inner.name != "W" and inner.data_type == F16
    nested_out = next(a.g for a in then_out.node[-1].attribute if a.name == "then_branch")
    read = [n.input[1] for n in (*then_out.node, *nested_out.node) if n.op_type == "MatMul"]
    if nested_w == "its own":
        (nested_own,) = nested_out.initializer
        assert read == [inner.name, nested_own.name] and len({"W", *read}) == 3
    else:
        assert read == [inner.name, inner.name]
    for c in (True, False):
        feed = {"x": RNG.standard_normal((2, 4)).astype(np.float32), "c": np.array(c)}
        assert close(run(m, feed)[0], run(out, feed)[0])


@pytest.mark.parametrize("target, ir", [(22, 10), (24, 12), (25, 13), (26, 13)])
def test_an_upgraded_model_gets_the_ir_version_its_opset_came_with(target, ir):
    """The IR version of the first onnx release with that opset: onnxruntime
    1.31 reads opset 26 and IR 13, and refused the IR 14 these were given."""
    out, _ = convert(mm_chain(), level="O2", target_opset=target)
    assert out.ir_version == ir
    feed = x_feed()
    assert np.isfinite(run(out, feed)[0]).all()  # (onnxruntime loads and runs it)


@pytest.mark.parametrize("how", [{"dtype": "bf16"}, {"target_opset": 13}])
def test_an_opset_upgrade_keeps_the_models_local_functions(how):
    """onnx's version converter drops local functions; the upgraded model
    keeps them, each at the opsets it declares, and loads (a call to a
    function the model no longer had did not)."""
    m = local_function_model(4, 1, opset=12, ir_version=7)
    out, plan = convert(m, level="O2", **how)  # (the full check runs)
    assert [f.name for f in out.functions] == ["Lin"]
    assert any("local functions kept" in note for note in plan.notes)
    if how.get("dtype") != "bf16":
        feed = {"x": RNG.standard_normal((1, 4)).astype(np.float32)}
        assert close(run(out, feed)[0], run(m, feed)[0])


@pytest.mark.parametrize("how", [{"white_list": ("local::Lin",)}, {"force_low": ("^call$",)}, {}])
def test_a_call_of_a_local_function_stays_fp32_whatever_the_lists_say(how):
    """The function's body is left as it is (fp32): a call handed low inputs
    would not fit it (white-listed, the conversion always failed the checker)."""
    m = local_function_model(4, 1, opset=17, ir_version=8)
    out, plan = convert(m, level="O2", **how)  # (the full check runs)
    assert plan.by_name("call").precision is Precision.FP32 and plan.by_name("call").rule == "local-function"
    feed = {"x": RNG.standard_normal((1, 4)).astype(np.float32)}
    assert close(run(out, feed)[0], run(m, feed)[0])


# ------------------------------------------------------------ opset upgrades


def _resize(op: str, opset: int, mode: str, scale: float) -> onnx.ModelProto:
    """One Upsample or Resize-10 of a 5x5 image by ``scale``."""
    size = int(5 * scale)
    scales = np.array([1, 1, scale, scale], np.float32)
    if opset == 7:
        nodes, inits = [helper.make_node(op, ["x"], ["y"], name="up", mode=mode, scales=scales.tolist())], []
    else:
        nodes, inits = [helper.make_node(op, ["x", "s"], ["y"], name="up", mode=mode)], [init("s", scales)]
    return model(nodes, [value("x", shape=(1, 1, 5, 5))], [value("y", shape=(1, 1, size, size))], inits, opset=opset)


UPGRADED = {
    "Resize-10 nearest, enlarging by 1.7": lambda: _resize("Resize", 10, "nearest", 1.7),
    "Resize-10 nearest, shrinking by 0.6": lambda: _resize("Resize", 10, "nearest", 0.6),
    "Resize-10 linear": lambda: _resize("Resize", 10, "linear", 2.0),
    "Upsample-7 linear": lambda: _resize("Upsample", 7, "linear", 3.0),
    "Upsample-9 nearest": lambda: _resize("Upsample", 9, "nearest", 1.5),
    "Hardmax-11 over axis 1 of three": lambda: model(
        [helper.make_node("Hardmax", ["x"], ["y"], name="hm", axis=1)],
        [value("x", shape=(2, 3, 4))],
        [value("y", shape=(2, 3, 4))],
        opset=11,
    ),
}


@pytest.mark.parametrize("case", sorted(UPGRADED))
def test_an_opset_upgrade_keeps_what_each_op_computes(case):
    """bf16 Casts need opset 13 (as does --target-opset 13). onnx's version
    converter gives Resize-11's defaults to Upsample and Resize-10 (other
    coordinates and rounding) and keeps Hardmax-11's axis, over which
    Hardmax-13 alone works: the upgraded model computed something else."""
    m = UPGRADED[case]()
    out, plan = convert(m, level="O0", target_opset=13)
    assert out.opset_import[0].version == 13 and any("opset upgraded from" in note for note in plan.notes)
    name = m.graph.node[0].name  # (the node the converter makes anew in its place keeps its name)
    assert name in {n.name for n in out.graph.node} and plan.by_name(name) is not None
    x = RNG.standard_normal([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    assert np.array_equal(run(out, {"x": x})[0], run(m, {"x": x})[0])


def test_an_upgrade_keeps_what_a_hardmax_in_a_branch_computes():
    """Hardmax-11 in an If branch is rewritten as in the main graph: the
    main graph's nodes were re-listed after the bodies had been gathered,
    which left the rewrite of the branch in a copy the model no longer held."""
    branch = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["h"], name="hm", axis=1)], "then", [], [value("h", shape=(1, 2, 4, 4))]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"], name="id")], "else", [], [value("i", shape=(1, 2, 4, 4))]
    )
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=other)]
    inputs = [value("x", shape=(1, 2, 4, 4)), value("c", onnx.TensorProto.BOOL, shape=())]
    m = model(nodes, inputs, [value("y", shape=(1, 2, 4, 4))], opset=11)
    out, _ = convert(m, level="O0", target_opset=13)
    feed = {"x": RNG.standard_normal((1, 2, 4, 4)).astype(np.float32), "c": np.array(True)}
    assert np.array_equal(run(out, feed)[0], run(m, feed)[0])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_upgrade_to_opset_10_leaves_the_resize_it_makes_as_resize_10_has_it(mode):
    """Upsample-9 becomes Resize-10, which computes as Upsample did and has
    none of Resize-11's modes: they were set on it all the same (onnxruntime
    refused the attribute; nearest was refused for want of a third input)."""
    m = _resize("Upsample", 9, mode, 2.0)
    out, _ = convert(m, level="O0", target_opset=10)
    assert [n.op_type for n in out.graph.node] == ["Resize"] and [a.name for a in out.graph.node[0].attribute] == ["mode"]
    x = RNG.standard_normal((1, 1, 5, 5)).astype(np.float32)
    assert np.array_equal(run(out, {"x": x})[0], run(m, {"x": x})[0])


def test_an_upgrade_the_converter_cannot_make_faithfully_is_refused():
    """Scan-8 has a batch axis Scan-9 has not (the converter drops it and the
    model's inputs change shape); a nearest Resize-10 that enlarges one axis
    and shrinks another has no Resize-11 rounding mode that matches."""
    body = helper.make_graph(
        [helper.make_node("Add", ["st", "xi"], ["st2"]), helper.make_node("Identity", ["st2"], ["so"])],
        "body",
        [value("st", shape=(1, 4)), value("xi", shape=(1, 4))],
        [value("st2", shape=(1, 4)), value("so", shape=(1, 4))],
    )
    scan = model(
        [helper.make_node("Scan", ["", "s0", "xs"], ["sf", "sos"], name="scan", body=body, num_scan_inputs=1)],
        [value("s0", shape=(2, 1, 4)), value("xs", shape=(2, 3, 1, 4))],
        [value("sf", shape=(2, 1, 4)), value("sos", shape=(2, 3, 1, 4))],
        opset=8,
    )
    with pytest.raises(AmpError, match="drops Scan-8's batch axis"):
        convert(scan, level="O1", dtype="bf16")
    mixed = model(
        [helper.make_node("Resize", ["x", "s"], ["y"], name="up", mode="nearest")],
        [value("x", shape=(1, 1, 4, 4))],
        [value("y", shape=(1, 1, 2, 8))],
        [init("s", np.array([1, 1, 0.5, 2], np.float32))],
        opset=10,
    )
    with pytest.raises(AmpError, match=r"'up'.*enlarges one axis and shrinks another"):
        convert(mixed, level="O2", target_opset=13)


def test_an_upgrade_keeps_the_labels_of_unnamed_nodes():
    """Pad-10's pads become a Constant node at opset 11: labels made after
    the upgrade shifted (the MatMul was MatMul_1 in the fp16 plan and
    MatMul_2 in the bf16 one), and a rule copied from one plan missed in
    the other. Unnamed nodes are named by their labels before the upgrade."""
    nodes = [
        helper.make_node("Pad", ["x"], ["p"], mode="constant", pads=[0, 1, 0, 1], value=0.5),
        helper.make_node("MatMul", ["p", "W"], ["y"]),
    ]
    m = model(nodes, [value("x", shape=(1, 4))], [value("y", shape=(1, 4))], [init("W", w(6, 4))], opset=10)
    for dtype in ("fp16", "bf16"):
        plan = convert(m, level="O2", dtype=dtype, keep_fp32=["^MatMul_1$"]).plan
        assert plan.by_name("MatMul_1").op_type == "MatMul" and plan.by_name("MatMul_1").rule == "user-keep-fp32"
        assert plan.by_name("Pad_0").op_type == "Pad"


def test_an_ir3_model_lists_the_initializers_the_conversion_adds_among_its_inputs():
    """Before IR version 4 every initializer must also be a graph input: the
    clipped low copy of a weight read fp32 and low failed the checker."""
    nodes = [
        helper.make_node("Softmax", ["W"], ["s"], name="sm", axis=1),
        helper.make_node("Mul", ["x", "W"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "s"], ["y"], name="add"),
    ]
    weight = np.array([[1e5, 1.0], [2.0, 3.0]], np.float32)
    m = model(
        nodes, [value("x", shape=(2, 2)), value("W", shape=(2, 2))], [value("y", shape=(2, 2))], [init("W", weight)], opset=8
    )
    m.ir_version = 3
    out, _ = convert(m, level="O3", safety=False)  # (the full check runs)
    inputs = {v.name: v.type.tensor_type.elem_type for v in out.graph.input}
    assert {t.name: t.data_type for t in out.graph.initializer}.items() <= inputs.items()
    assert F16 in inputs.values()


def test_the_plan_says_which_casts_of_the_input_the_clean_up_removed():
    """A Cast of an int64 tensor to int64 changes nothing: the clean-up
    removes it, and its plan entry says so (the written model has no such
    node); the Cast that writes a graph output stays."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["same"], name="noop", to=I64),
        helper.make_node("Gather", ["table", "same"], ["rows"], name="lookup", axis=0),
        helper.make_node("MatMul", ["rows", "W"], ["y"], name="mm"),
        helper.make_node("Cast", ["ids"], ["ids_out"], name="kept", to=I64),
    ]
    inits = [init("table", w(8, 4)), init("W", w(4, 4))]
    inputs = [value("ids", I64, shape=(2,))]
    m = model(nodes, inputs, [value("y", shape=(2, 4)), value("ids_out", I64, shape=(2,))], inits)
    out, plan = convert(m, level="O2")
    assert {n.name for n in out.graph.node} >= {"lookup", "mm", "kept"} and "noop" not in {n.name for n in out.graph.node}
    assert plan.by_name("noop").reason.endswith("removed by the clean-up: it changed nothing")
    assert "removed" not in plan.by_name("kept").reason and "removed" not in plan.by_name("mm").reason


REMOVED = "removed by the clean-up: it changed nothing"


def bodies_model() -> onnx.ModelProto:
    """An If, a Loop and a Scan whose bodies each hold a Cast of the outer
    int64 ``ids`` to int64 (``*_noop``); the then branch also holds an
    exact round trip of the outer fp16 ``xh`` (``up``, ``down``: ``down``
    goes first, then ``up``, which only ``down`` read)."""

    def gather(prefix: str, out: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Cast", ["ids"], [f"{prefix}_same"], name=f"{prefix}_noop", to=I64),
            helper.make_node("Gather", ["table", f"{prefix}_same"], [out], name=f"{prefix}_gather", axis=0),
        ]

    then_g = helper.make_graph(
        [
            *gather("then", "t_rows"),
            helper.make_node("Cast", ["xh"], ["up"], name="up", to=F32),
            helper.make_node("Cast", ["up"], ["down"], name="down", to=F16),
            helper.make_node("Identity", ["down"], ["t_h"], name="then_id"),
        ],
        "then",
        [],
        [value("t_rows"), value("t_h", F16)],
    )
    else_g = helper.make_graph(
        [*gather("else", "e_rows"), helper.make_node("Identity", ["xh"], ["e_h"], name="else_id")],
        "else",
        [],
        [value("e_rows"), value("e_h", F16)],
    )
    loop_body = helper.make_graph(
        [
            *gather("loop", "l_rows"),
            helper.make_node("Add", ["v_in", "l_rows"], ["v_out"], name="loop_add"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
        ],
        "loop_body",
        [value("i", I64, shape=()), value("cond_in", onnx.TensorProto.BOOL, shape=()), value("v_in")],
        [value("cond_out", onnx.TensorProto.BOOL, shape=()), value("v_out")],
    )
    scan_body = helper.make_graph(
        [*gather("scan", "s_rows"), helper.make_node("Add", ["state_in", "s_rows"], ["state_out"], name="scan_add")],
        "scan_body",
        [value("state_in"), value("step", shape=(1,))],
        [value("state_out")],
    )
    nodes = [
        helper.make_node("Cast", ["ids"], ["main_same"], name="main_noop", to=I64),
        helper.make_node("Gather", ["table", "main_same"], ["rows"], name="main_gather", axis=0),
        helper.make_node("If", ["cond"], ["picked", "h"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trip", "", "rows"], ["looped"], name="loop", body=loop_body),
        helper.make_node("Scan", ["looped", "steps"], ["scanned"], name="scan", body=scan_body, num_scan_inputs=1),
        helper.make_node("Add", ["picked", "scanned"], ["s"], name="add"),
        helper.make_node("MatMul", ["s", "W"], ["y"], name="mm"),
    ]
    inputs = [
        value("ids", I64, shape=(2,)),
        value("xh", F16),
        value("cond", onnx.TensorProto.BOOL, shape=()),
        value("steps", shape=(3, 1)),
    ]
    inits = [init("table", w(8, 4)), init("W", w(4, 4)), init("trip", np.array(2, np.int64))]
    return model(nodes, inputs, [value("y"), value("h", F16)], inits)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_plan_says_which_casts_in_bodies_the_clean_up_removed(dtype):
    """The plan said so only of the main graph's removed Casts: those in
    If, Loop and Scan bodies (a Cast that changes nothing, both halves of an
    exact round trip, the first removed only once the second was) kept a
    plan entry that did not say they were gone."""
    m = bodies_model()
    out, plan = convert(m, level="O2", dtype=dtype)
    gone = {"main_noop", "then_noop", "else_noop", "loop_noop", "scan_noop", "up", "down"}
    assert gone.isdisjoint(n.name for n in iter_nodes(out.graph))
    assert {e.name for e in plan if REMOVED in e.reason} == gone
    assert plan.by_name("loop_noop", "loop/body").reason.endswith(REMOVED)
    assert plan.by_name("up", "if/then_branch").reason.endswith(REMOVED)
    feeds = {
        "ids": np.array([1, 5], np.int64),
        "xh": RNG.standard_normal((2, 4)).astype(np.float16),
        "steps": RNG.standard_normal((3, 1)).astype(np.float32),
    }
    if dtype == "fp16":
        for cond in (True, False):
            for ref, got in zip(
                run(m, {**feeds, "cond": np.array(cond)}), run(out, {**feeds, "cond": np.array(cond)}), strict=True
            ):
                assert close(ref, got)


def test_the_plan_says_which_casts_the_clean_up_removed_when_it_removes_hundreds():
    """More than a few hundred Casts added and removed take the bulk paths
    (the rewrite's one parse of the new Casts, the clean-up's one sort):
    the index's nodes must still be the graph's, or no entry would say so."""
    n = 300
    nodes = []
    for k in range(n):
        nodes += [
            helper.make_node("Cast", ["ids"], [f"same{k}"], name=f"noop{k}", to=I64),
            helper.make_node("Gather", ["table", f"same{k}"], [f"rows{k}"], name=f"gather{k}", axis=0),
            helper.make_node("MatMul", [f"rows{k}", "W"], [f"y{k}"], name=f"mm{k}"),
        ]
    outputs = [value(f"y{k}") for k in range(n)]
    m = model(nodes, [value("ids", I64, shape=(2,))], outputs, [init("table", w(8, 4)), init("W", w(4, 4))])
    out, plan = convert(m, level="O2")
    assert count_casts(out) == n  # (one per output, back to fp32)
    assert [n.op_type for n in out.graph.node[:3]] == ["Gather", "MatMul", "Cast"]
    assert {e.name for e in plan if REMOVED in e.reason} == {f"noop{k}" for k in range(n)}
    feeds = {"ids": np.array([1, 5], np.int64)}
    assert all(close(a, b) for a, b in zip(run(m, feeds), run(out, feeds), strict=True))


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_shape_and_size_of_a_low_tensor_are_unchanged_in_the_plan_and_its_totals(level):
    """Shape and Size read only the shape of their float input and compute
    in no float type, yet the plan counted them fp32 (O1, O2: follow nodes
    waiting on consumers that need no float) or low (O3) in its totals;
    their reason said they were fed only by constants while they read a
    low activation. They read it as it is."""
    out, plan = convert(shape_readers_model(), level=level)
    for name in ("shp", "size"):
        entry = plan.by_name(name)
        assert (entry.precision, entry.rule) == (Precision.UNCHANGED, "shape-only")
        assert "fed only by constants" not in entry.reason
    assert plan.counts() == plan.as_dict()["counts"] == {"low": 3, "fp32": 0, "unchanged": 2}
    assert plan.format_table().splitlines()[-1] == "3 low, 0 fp32, 2 unchanged"
    assert [n.input[0] for n in out.graph.node if n.name in ("shp", "size")] == ["t", "t"] and elem_types(out)["t"] == F16


def test_an_upgrade_that_inference_at_the_new_opset_contradicts_is_refused_as_the_inputs_fault():
    """The output is declared rank 2 while Reshape makes rank 3: inference
    lets it pass at opset 12 and not at 22, so the converted model failed
    its check, blaming the Cast the conversion put at the output (exit 3).
    The upgraded model is checked first: refused, the input's shape named."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["s0"], name="g", axis=0),
        helper.make_node("Unsqueeze", ["s0"], ["s0u"], name="u", axes=[0]),
        helper.make_node("Concat", ["s0u", "c"], ["newshape"], name="cat", axis=0),
        helper.make_node("Reshape", ["a", "newshape"], ["y"], name="rs"),
    ]
    inits = [init("W", w(4, 4)), init("c", np.array([2, 2], np.int64)), init("zero", np.array(0, np.int64))]
    m = model(nodes, [value("x", shape=(1, 4))], [helper.make_tensor_value_info("y", F32, [1, "seq"])], inits, opset=12)
    out, _ = convert(m, level="O2")  # (at its own opset it converts)
    assert out.opset_import[0].version == 12
    with pytest.raises(AmpError, match=r"upgraded from opset 12 to 22, the model fails ONNX shape inference .*node name: rs"):
        convert(m, level="O2", target_opset=22)


@pytest.mark.parametrize("stash", [None, 1, 0])
def test_layernorm_follows_unless_it_keeps_its_statistics_in_the_data_type(stash):
    """LayerNormalization computes its mean and variance in float32 whatever
    the data's type (stash_type 1, the default): it follows its input, so a
    MatMul before it and after it need no Cast pair. With stash_type 0 the
    statistics would be computed in fp16: it stays fp32 (below O3)."""
    attrs = {"axis": -1, **({} if stash is None else {"stash_type": stash})}
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", **attrs),
        helper.make_node("MatMul", ["n", "W"], ["y"], name="mm2"),
    ]
    inits = [init("W", w(4, 4)), init("g", np.ones(4, np.float32)), init("b", np.zeros(4, np.float32))]
    m = model(nodes, [value("x")], [value("y")], inits)
    for level in ("O1", "O2"):
        out, plan = convert(m, level=level)
        ln = plan.by_name("ln")
        if stash == 0:
            assert (ln.precision, ln.rule) == (Precision.FP32, "stash-type")
        else:
            assert ln.precision is Precision.LOW and ln.rule == "follow"
            assert count_casts(out) == 2  # (the model's input and output only)
        feeds = x_feed()
        assert close(run(m, feeds)[0], run(out, feeds)[0])
    assert convert(m, level="O3").plan.by_name("ln").precision is Precision.LOW


def test_a_clipped_bf16_fill_below_opset_20_is_a_float32_fill_cast_low():
    """ConstantOfShape holds bf16 from opset 20 only: below it, a mask fill
    past bf16's range (float32's lowest, as exported attention masks use) is
    filled in float32, clipped, and cast; onnx's full check accepts the model
    and validation (emulated: onnxruntime's CPU has no bf16 Add) passes."""
    lowest = numpy_helper.from_array(np.array([np.finfo(np.float32).min], np.float32), "fill")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["mask"], value=lowest),
        helper.make_node("Add", ["x", "mask"], ["y"]),
    ]
    m = model(nodes, [value("x", shape=[2, 4])], [value("y", shape=[2, 4])], opset=17)
    result = convert(m, level="O3", dtype="bf16")
    onnx.checker.check_model(result.model, full_check=True)
    fills = [n for n in result.model.graph.node if n.op_type == "ConstantOfShape"]
    assert {n.attribute[0].t.data_type for n in fills} <= {TensorProto.FLOAT}
    casts = {n.input[0]: n for n in result.model.graph.node if n.op_type == "Cast"}
    (fill,) = [n for n in fills if n.output[0] in casts]  # (the clipped copy; the original stays float32)
    filled = numpy_helper.to_array(fill.attribute[0].t).astype(np.float32)
    assert np.isfinite(filled).all() and (filled < -3e38).all()
    assert casts[fill.output[0]].attribute[0].i == TensorProto.BFLOAT16
    assert amp_convert.validate(m, result.model, samples=1, provider="cpu").passed
    at_20 = convert(model(nodes, [value("x", shape=[2, 4])], [value("y", shape=[2, 4])], opset=20), level="O3", dtype="bf16")
    assert TensorProto.BFLOAT16 in {n.attribute[0].t.data_type for n in at_20.model.graph.node if n.op_type == "ConstantOfShape"}
