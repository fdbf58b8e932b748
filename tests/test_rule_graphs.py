"""The rule zoo (models/rule_graphs.py) end to end: every graph at O0-O3 in
fp16 and bf16, written to disk and read back, passes the full checker with
its outputs' names and types as they were and no redundant Cast; at O1 and
O2 it stays within the default tolerance under emulated rounding; fp16
models load and run in onnxruntime at every level."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from helpers import iter_nodes, redundant_casts, run

from amp_convert import convert
from amp_convert.calibrate import calibrate
from amp_convert.cleanup import count_casts
from amp_convert.inputs import make_source
from amp_convert.save import save_model
from amp_convert.validate import ValidationConfig, validate
from models.rule_graphs import RULE_GRAPHS


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
