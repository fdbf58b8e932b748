"""The graph index's tables and the plan's columns against the per-node
answers they stand for, on the rule graphs, zoo models with control flow,
and graphs made of the cases the arrays cannot encode (a node of 70 inputs,
an absent optional input, a sequence, a tensor of no known type,
custom-domain ops named like dtype-agnostic ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import init, model, value
from onnx import TensorProto, helper, numpy_helper

from amp_convert import convert, typeinfo
from amp_convert.graph import build_context
from amp_convert.schema import model_opsets
from models.rule_graphs import RULE_GRAPHS

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"


def _odd_cases() -> onnx.ModelProto:
    """Nodes whose slots the arrays cannot encode or that read a name with
    no type: each must be worked out as the per-node code does."""
    w = np.full((2, 4), 0.5, np.float32)
    body = helper.make_graph(
        [helper.make_node("Relu", ["element"], ["relu"], name="body_relu")],
        "body",
        [value("element", shape=None)],
        [value("relu", shape=None)],
    )
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.float32([3.0]), "sparse"), numpy_helper.from_array(np.int64([5])), [2, 4]
    )
    nodes = [
        # 70 inputs: past the 31 slots a kind code holds and the 62 a bit mask holds; the last an initializer
        helper.make_node("Concat", ["x"] * 69 + ["Wcat"], ["cat"], name="wide", axis=0),
        helper.make_node("ReduceMean", ["cat"], ["mean"], name="mean", axes=[0], keepdims=1),
        helper.make_node("Clip", ["mean", "", "hi"], ["clip"], name="clip"),  # an absent optional input
        helper.make_node("SequenceConstruct", ["clip", "x"], ["seq"], name="seq"),
        helper.make_node("SequenceAt", ["seq", "idx"], ["at"], name="at"),
        helper.make_node("Mystery", ["at"], ["mystery"], name="mystery", domain="custom"),  # output of no known type
        helper.make_node("Add", ["mystery", "x"], ["unknown_sum"], name="unknown_sum"),
        # W is read low by a MatMul, dtype-agnostically by Shape, and as it is by a custom op called Shape
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
        helper.make_node("Shape", ["W"], ["shape"], name="shape"),
        helper.make_node("Shape", ["W"], ["custom_shape"], name="custom_shape", domain="custom"),
        helper.make_node("MatMul", ["x", "Wlow"], ["mm2"], name="mm2"),
        helper.make_node("Shape", ["Wlow"], ["shape2"], name="shape2"),
        helper.make_node("Add", ["mm", "mm2"], ["y"], name="sum"),
        # a body in a node of one output, typed where its node is
        helper.make_node("SequenceMap", ["seq"], ["mapped"], name="map", body=body),
        # a sparse Constant after a dense one of the same kind: only the dense one's outcome is reused
        helper.make_node("Constant", [], ["dense"], name="dense", value=numpy_helper.from_array(w)),
        helper.make_node("Constant", [], ["sparse"], name="sparse", sparse_value=sparse),
        helper.make_node("Mul", ["dense", "sparse"], ["product"], name="product"),
    ]
    outputs = [value("y"), value("unknown_sum"), value("shape", TensorProto.INT64, [2])]
    outputs += [value("shape2", TensorProto.INT64, [2]), value("custom_shape", TensorProto.INT64, [2]), value("product")]
    outputs.append(helper.make_tensor_sequence_value_info("mapped", TensorProto.FLOAT, None))
    initializers = [
        init("Wcat", w),
        init("hi", np.float32(6.0)),
        init("W", np.eye(4, dtype=np.float32)),
        init("Wlow", w.T.copy()),
    ]
    return model(
        nodes,
        [value("x"), value("idx", TensorProto.INT64, [])],
        outputs,
        initializers,
        extra_opsets=[("custom", 1)],
    )


def _asked_first_by_a_visited_node() -> onnx.ModelProto:
    """x's Cast is asked for by a node the rewrite visits (mm_x: its output
    is a graph output) before z's, whose reads the arrays settle, and then
    by a settled read after z's: the Casts come in the order first asked."""
    nodes = [
        helper.make_node("MatMul", ["x", "x"], ["y"], name="mm_x"),
        helper.make_node("MatMul", ["z", "z"], ["q"], name="mm_z"),
        helper.make_node("MatMul", ["x", "q"], ["r"], name="mm_xq"),
        helper.make_node("Relu", ["r"], ["s"], name="relu"),
    ]
    inputs, outputs = [value(n, shape=(4, 4)) for n in ("x", "z")], [value(n, shape=(4, 4)) for n in ("y", "s")]
    return model(nodes, inputs, outputs)


def _shared_beyond_the_range() -> onnx.ModelProto:
    """W (beyond fp16) is read low by a MatMul and fp32 by an Exp: with
    clipping on, its low reader gets a clipped copy, not a Cast (a version
    the arrays must leave to the loop)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Exp", ["W"], ["e"], name="exp"),
        helper.make_node("MatMul", ["h", "e"], ["y"], name="mm2"),
    ]
    return model(nodes, [value("x", shape=(4, 4))], [value("y", shape=(4, 4))], [init("W", np.full((4, 4), 1e6, np.float32))])


def _casts_after_one_node() -> onnx.ModelProto:
    """A low Split whose first two outputs are graph outputs (renamed, each
    given a Cast after the Split, one at a time) and whose third a Softmax
    reads fp32 (a settled read: its Cast comes after those two)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Split", ["h"], ["a", "b", "c"], name="split", axis=1, num_outputs=3),
        helper.make_node("Softmax", ["c"], ["sm"], name="softmax", axis=-1),
        helper.make_node("Mul", ["sm", "sm"], ["y"], name="mul"),
    ]
    w = np.random.default_rng(1).standard_normal((6, 6)).astype(np.float32)
    outputs = [value("a", shape=(2, 2)), value("b", shape=(2, 2)), value("y", shape=(2, 2))]
    return model(nodes, [value("x", shape=(2, 6))], outputs, [init("W", w)], opset=18)


BUILT = {"odd": _odd_cases, "asked-first": _asked_first_by_a_visited_node, "shared": _shared_beyond_the_range}
BUILT["after-one-node"] = _casts_after_one_node
CASES = [*sorted(RULE_GRAPHS), "zoo:controlflow", "zoo:lstm", "zoo:gpt2", *BUILT]


def _load(name: str) -> onnx.ModelProto:
    if name in BUILT:
        return BUILT[name]()
    return RULE_GRAPHS[name]() if name in RULE_GRAPHS else onnx.load(str(ZOO / f"{name[4:]}.onnx"))


# Each level, dtype and I/O setting; and at O2 with constants clipped (the safety rule keeps none fp32 for them).
SETTINGS = [
    {"level": level, "dtype": dtype, "io_types": io}
    for level in ("O1", "O2", "O3")
    for dtype in ("fp16", "bf16")
    for io in ("keep", "low")
]
SETTINGS.append({"level": "O2", "dtype": "fp16", "io_types": "keep", "clip_initializers": True})


def _results(original: onnx.ModelProto) -> list[tuple[bytes, str, dict]]:
    out = []
    for setting in SETTINGS:
        r = convert(original, check="none", **setting)
        out.append((r.model.SerializeToString(deterministic=True), r.plan.to_json(), r.stats.as_dict()))
    return out


def _accepted(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", CASES)
def test_every_setting_converts_the_case_the_same_way_twice_and_as_validly(name):
    """The cases the array tables cannot encode go through every level,
    dtype and I/O setting: each conversion repeats byte for byte, and the
    checker accepts its output whenever it accepts the input."""
    original = _load(name)
    first = _results(original)
    assert _results(original) == first
    if _accepted(original):
        for setting in SETTINGS:
            assert _accepted(convert(original, check="none", **setting).model), setting


@pytest.mark.parametrize("name", CASES)
def test_the_tensor_table_answers_for_each_slot_what_its_name_does(name):
    """Questions about the names the input slots read are asked once per
    tensor and spread over the slots: for every graph (bodies too, whose
    slots read outer values the table does not hold) the answers are, slot
    by slot, those of asking each slot's name: types and the tensors
    retyped."""
    from itertools import repeat

    from amp_convert.graph import UNTYPED
    from amp_convert.typeinfo import infer_types

    model = _load(name)
    root = build_context(model.graph)
    infer_types(root, model_opsets(model))
    for ctx in root.walk():
        table, slot_names = ctx.tensors(), ctx.input_slots().names
        for k, number in enumerate(table.of_slot.tolist()):
            assert (table.names[number] == slot_names[k]) if number >= 0 else slot_names[k] not in table.number
        per_slot = np.fromiter(map(ctx.types.get, slot_names, repeat(UNTYPED)), np.int64, len(slot_names))
        assert ctx.input_types().tolist() == per_slot.tolist(), ctx.path
        for some in (set(slot_names[::3]), set(ctx.initializers), {*ctx.free_names, ""}, set()):
            assert table.slots_in(some).tolist() == [n in some for n in slot_names], ctx.path


@pytest.mark.parametrize("name", CASES)
def test_names_in_use_are_the_names_of_the_model(name):
    """The rewrite's new names are checked a few dicts at a time, not
    against the set of every name: on a valid model both say the same of
    every name the model has (read, defined or listed, in any graph), and
    of names it does not; new names never repeat one in use or made."""
    from amp_convert.graph import NameGenerator, name_in_use, tensor_names

    root = build_context(_load(name).graph)
    every = tensor_names(root) - {""}
    in_use = name_in_use(root)
    assert all(map(in_use, every))
    strangers = [f"{n}_fresh" for n in sorted(every)[:50]] + ["", "no such tensor"]
    assert [in_use(n) for n in strangers] == [n in every for n in strangers]
    bases = [*sorted(every)[:20], "cast", "cast", "cast"]
    made, from_set = NameGenerator(in_use), NameGenerator(every.__contains__)
    new = [made(base) for base in bases]
    assert len(set(new)) == len(new) and not every.intersection(new) and new[-3:] == ["cast", "cast_1", "cast_2"]
    assert [from_set(base) for base in bases] == new  # (the set of every name says the same)


def test_casts_made_together_take_names_around_the_models(tmp_path):
    """The Casts of a main graph, named together, take the names one at a
    time would give where a name they would take is the model's already."""
    nodes = [
        helper.make_node("Identity", ["x"], ["x_fp16"], name="x_fp16_cast"),
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "x_fp16"], ["y"], name="add"),
    ]
    original = model(nodes, [value("x", shape=(2, 2))], [value("y", shape=(2, 2))], [init("W", np.eye(2, dtype=np.float32))])
    path = tmp_path / "out.onnx"
    onnx.save(convert(original, level="O2").model, path)
    written = onnx.load(path)
    onnx.checker.check_model(written, full_check=True)
    casts = {n.name: (n.input[0], n.output[0]) for n in written.graph.node if n.op_type == "Cast"}
    assert casts["x_fp16_1_cast"] == ("x", "x_fp16_1")
    names = [n.name for n in written.graph.node]
    assert len(set(names)) == len(names)
    import onnxruntime as ort

    x = np.float32([[1, 2], [3, 4]])
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x + x, rtol=1e-3)


@pytest.mark.parametrize("name", ["zoo:gpt2", "zoo:controlflow", "odd"])
def test_plan_columns_and_tally_agree_with_the_entries(name):
    """The columns the rewrite reads and the tally the report reads are
    those of the entries, one by one."""
    from collections import Counter

    from amp_convert.plan import Precision
    from amp_convert.report import build_report

    result = convert(_load(name), level="O2", check="none")
    graphs = result.plan.entries
    columns = {path: entries.columns() for path, entries in graphs.items()}
    tally = result.plan.tally()
    report = build_report(
        command="convert", model_path="m.onnx", model_nodes=0, output_path=None, written=False, options={}, conversion=result
    )
    made = {path: list(entries) for path, entries in graphs.items()}
    assert tally == Counter((e.precision, e.rule, e.op_type) for entries in made.values() for e in entries)
    assert report["plan"]["rules"] == dict(sorted(Counter(e.rule for e in result.plan).items()))
    low_ops = Counter(e.op_type for e in result.plan if e.precision is Precision.LOW)
    assert report["plan"]["low_ops"] == dict(sorted(low_ops.items()))
    for path, entries in made.items():
        low = [e.precision is Precision.LOW for e in entries]
        assert columns[path][0] == [e.precision for e in entries]
        assert columns[path][1] == [e.low_inputs if is_low else () for e, is_low in zip(entries, low, strict=True)]
        assert columns[path][2] == [e.low_outputs if is_low else () for e, is_low in zip(entries, low, strict=True)]
        assert [e.index for e in entries] == list(range(len(entries)))


def test_an_entry_read_is_the_one_kept():
    """A change to an entry (the planner's backward pass changes entries it
    reads) is what is read next, by index, as a decision, in the columns
    and in the tally."""
    from amp_convert.plan import Precision

    result = convert(_load("zoo:gpt2"), level="O2", check="none")
    entries = result.plan.entries[""]
    i = next(k for k, e in enumerate(entries) if e.precision is Precision.LOW)
    entry = entries[i]
    assert entries[i] is entry and entries[i - len(entries)] is entry
    fp32, low = ((p, entry.rule, entry.op_type) for p in (Precision.FP32, Precision.LOW))
    before = result.plan.tally()
    entry.precision, entry.low_inputs = Precision.FP32, ()
    assert entries.decision(i)[0] is Precision.FP32 and entries.columns()[0][i] is Precision.FP32
    after = result.plan.tally()
    assert (after[fp32], after[low]) == (before[fp32] + 1, before[low] - 1)


def test_plan_entries_behave_as_the_list_they_stand_for():
    """Indexes out of range raise (a negative one made up an entry and
    corrupted the graph's rows), slices work, plans compare by their
    entries, and a plan built by hand from lists of entries works."""
    import copy

    from amp_convert.plan import Plan, PlanEntry, Precision

    first = convert(_load("zoo:gpt2"), level="O2", check="none").plan
    second = convert(_load("zoo:gpt2"), level="O2", check="none").plan
    entries = first.entries[""]
    n, before = len(entries), first.to_json()
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            entries[bad]
    assert first.to_json() == before and entries[-n] is entries[0]
    assert entries[1:4] == [entries[1], entries[2], entries[3]] and [e.index for e in entries[-2:]] == [n - 2, n - 1]
    assert first == second and copy.deepcopy(first) == first
    second.entries[""][0].reason = "changed"
    assert first != second
    made = [PlanEntry("", 0, "mm", "MatMul", "", Precision.LOW, "white-list", "w", (0, 1), (0,))]
    by_hand = Plan("O2", "fp16", "default", entries={"": made})
    assert by_hand.counts() == {"low": 1, "fp32": 0, "unchanged": 0}
    assert by_hand.entries[""].columns() == ([Precision.LOW], [(0, 1)], [(0,)]) and by_hand.entries[""] == made


def _typed_chain(ops: list[str], declared: dict[str, int]) -> onnx.ModelProto:
    """x -> ops... -> y, the tensors in ``declared`` declared with those types."""
    nodes, previous = [], "x"
    for k, op in enumerate(ops):
        nodes.append(helper.make_node(op, [previous], [f"t{k}"], name=f"n{k}"))
        previous = f"t{k}"
    nodes.append(helper.make_node("Identity", [previous], ["y"], name="out"))
    infos = [helper.make_tensor_value_info(n, t, None) for n, t in declared.items()]
    graph = helper.make_graph(nodes, "g", [value("x")], [value("y")], value_info=infos)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_types_follow_a_long_chain_and_a_declared_type_breaks_it():
    """A chain of 3,000 nodes is typed end to end; a type declared midway
    (value_info saying float16) is the one its followers take."""
    model = _typed_chain(["Relu"] * 3000, {"t1500": TensorProto.FLOAT16})
    root = build_context(model.graph)
    typeinfo.infer_types(root, model_opsets(model))
    found = root.types
    assert found["t1499"] == TensorProto.FLOAT and found["t1500"] == found["t2999"] == TensorProto.FLOAT16
