"""The rule zoo (models/rule_graphs.py) end to end: every graph at O0-O3 in
fp16 and bf16, written to disk and read back, passes the full checker with
its outputs' names and types as they were and no redundant Cast; at O1 and
O2 it stays within the default tolerance under emulated rounding; fp16
models load and run in onnxruntime at every level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import init, iter_nodes, model, redundant_casts, run, value
from onnx import helper

from amp_convert import convert
from amp_convert.calibrate import calibrate
from amp_convert.cleanup import count_casts
from amp_convert.inputs import make_source
from amp_convert.saving import save_model
from amp_convert.validation import ValidationConfig, validate
from models.rule_graphs import RULE_GRAPHS

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"


def _outputs(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(v.name, v.type.tensor_type.elem_type) for v in model.graph.output]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
@pytest.mark.parametrize("name", sorted(RULE_GRAPHS))
def test_rule_graph_converts_to_a_valid_model_within_tolerance(name, level, dtype, tmp_path: Path):
    original = RULE_GRAPHS[name]()
    source = make_source(original, samples=2)
    # As the CLI does when it validates: the safety rules get the fp32 run's value ranges
    # (out_of_range's x * 1e5 would otherwise be cast to fp16 by the node after it).
    calibration = calibrate(original, source, "cpu") if level in ("O1", "O2") else None
    path = tmp_path / f"{name}.onnx"
    result = convert(original, level=level, dtype=dtype, calibration=calibration)
    save_model(result.model, path)
    written = onnx.load(str(path))
    # The reported counts (kept from the index and the passes' own counts) are the real ones.
    assert (result.casts_before, result.casts_after) == (count_casts(original), count_casts(written))
    onnx.checker.check_model(written, full_check=True)
    assert _outputs(written) == _outputs(original)
    assert redundant_casts(written, original) == []
    if level in ("O1", "O2"):
        result = validate(original, written, source, ValidationConfig(provider="cpu", per_node=False))
        assert result.passed, [o.verdict(result.tolerance) for o in result.outputs]
    if dtype == "fp16":
        outputs = run(written, next(iter(source)))
        assert [o.shape for o in outputs] == [o.shape for o in run(original, next(iter(source)))]


def test_the_rule_zoo_covers_every_kind_of_rule():
    ops = {node.op_type for build in RULE_GRAPHS.values() for node in iter_nodes(build().graph)}
    expected = {"Softmax", "Relu", "BatchNormalization", "NonMaxSuppression", "Resize", "Shape", "DequantizeLinear"}
    expected |= {"FusedMatMul", "If", "Loop", "Scan", "Constant", "ConstantOfShape", "Cast"}
    assert expected <= ops


def _branch_declaring_an_outer_value() -> onnx.ModelProto:
    """A branch that reads the outer ``h`` (low at O2) in an fp32 Softmax and
    declares ``h`` in its own value_info, as some exporters do: its type
    table then knows ``h`` as float32, and only its scope says it is not
    the branch's own."""
    then_nodes = [
        helper.make_node("Softmax", ["h"], ["s"], name="then_softmax"),
        helper.make_node("Neg", ["s"], ["t"], name="then_neg"),
    ]
    then_g = helper.make_graph(then_nodes, "then", [], [value("t")], value_info=[value("h")])
    else_g = helper.make_graph([helper.make_node("Relu", ["h"], ["e"], name="else_relu")], "else", [], [value("e")])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    return model(
        nodes, [value("x"), value("cond", onnx.TensorProto.BOOL, [])], [value("y")], [init("W", np.eye(4, dtype=np.float32))]
    )


def _graph_output_read_inside() -> onnx.ModelProto:
    """``h``, a low MatMul's output, is a graph output (kept fp32: its
    producer writes ``h_fp16`` and a Cast writes ``h``) and is read by a low
    Relu, which must be handed ``h_fp16``."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W"], ["z"], name="mm2"),
    ]
    return model(nodes, [value("x")], [value("h"), value("z")], [init("W", np.eye(4, dtype=np.float32))])


BUILT = {"declared-outer": _branch_declaring_an_outer_value, "output-read-inside": _graph_output_read_inside}


@pytest.mark.parametrize("name", [*sorted(RULE_GRAPHS), "zoo:controlflow", "zoo:lstm", "zoo:gpt2", *BUILT])
def test_the_rewrite_visiting_only_filtered_nodes_writes_what_visiting_every_node_writes(name, monkeypatch):
    """The rewrite looks only at the nodes its array pass says may need
    another version of a tensor: the result must be the same bytes as when
    it looks at every node, at every level, dtype and I/O setting."""
    from amp_convert import rewrite

    if name in BUILT:
        original = BUILT[name]()
    else:
        original = RULE_GRAPHS[name]() if name in RULE_GRAPHS else onnx.load(str(ZOO / f"{name[4:]}.onnx"))
    settings = [(level, dtype, io) for level in ("O1", "O2", "O3") for dtype in ("fp16", "bf16") for io in ("keep", "low")]
    filtered = [convert(original, level=lv, dtype=dt, io_types=io, check="none").model for lv, dt, io in settings]
    monkeypatch.setattr(rewrite, "nodes_to_visit", lambda ctx, *_: list(range(len(ctx.ins))))
    for (level, dtype, io), converted in zip(settings, filtered, strict=True):
        every = convert(original, level=level, dtype=dtype, io_types=io, check="none").model
        assert converted.SerializeToString(deterministic=True) == every.SerializeToString(deterministic=True), (level, dtype, io)
