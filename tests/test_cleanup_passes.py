"""The clean-up passes one by one: each says modified=False where it has
nothing to do and leaves the graph as it was, and True with the change
its rules describe where it has; the converted graphs still run."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import F16, F32, model, run, value
from onnx import helper

from amp_convert.cleanup import FoldCastRoundTrips, RemoveIdentityCasts, RemoveUnusedCasts, clean_up

X16 = np.linspace(-2, 2, 8, dtype=np.float16).reshape(2, 4)
X32 = X16.astype(np.float32)


def _chain(elem: int, *casts: int) -> onnx.ModelProto:
    """x (of ``elem``) -> a Cast to each of ``casts`` in turn (c0, c1, ...) -> Relu -> y."""
    nodes, last = [], "x"
    for k, to in enumerate(casts):
        nodes.append(helper.make_node("Cast", [last], [f"c{k}"], name=f"cast{k}", to=to))
        last = f"c{k}"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
    return model(nodes, [value("x", elem)], [value("y", casts[-1] if casts else elem)])


def _relu_input(m: onnx.ModelProto) -> str:
    return next(n for n in m.graph.node if n.op_type == "Relu").input[0]


def test_remove_identity_casts_bypasses_a_cast_to_the_type_it_has():
    m = _chain(F32, F32)
    result = RemoveIdentityCasts()(m)
    assert result.modified and result.count == 1 and result.bypassed == {"c0"}
    assert _relu_input(m) == "x" and [n.op_type for n in m.graph.node] == ["Cast", "Relu"]  # (unread, not deleted)
    np.testing.assert_array_equal(run(m, {"x": X32})[0], np.maximum(X32, 0))


def test_remove_identity_casts_has_nothing_to_do_on_a_cast_that_changes_the_type():
    m = _chain(F32, F16)
    before = m.SerializeToString()
    result = RemoveIdentityCasts()(m)
    assert not result.modified and result.count == 0 and result.bypassed == set()
    assert m.SerializeToString() == before


def test_fold_cast_round_trips_bypasses_the_second_cast_of_an_exact_round_trip():
    m = _chain(F16, F32, F16)
    result = FoldCastRoundTrips()(m)
    assert result.modified and result.count == 1 and result.bypassed == {"c1", "c0"}
    assert _relu_input(m) == "x"
    np.testing.assert_array_equal(run(m, {"x": X16})[0], np.maximum(X16, 0))


def test_fold_cast_round_trips_keeps_a_lossy_pair_and_an_identity_cast():
    for m in (_chain(F32, F16, F32), _chain(F32, F32)):
        before = m.SerializeToString()
        result = FoldCastRoundTrips()(m)
        assert not result.modified and result.count == 0
        assert m.SerializeToString() == before


def test_remove_unused_casts_deletes_the_bypassed_casts_and_the_ones_before_them():
    m = _chain(F16, F32, F16)
    kept = next(n for n in m.graph.node if n.op_type == "Relu")
    casts = [n for n in m.graph.node if n.op_type == "Cast"]
    bypassed = FoldCastRoundTrips()(m).bypassed
    result = RemoveUnusedCasts(bypassed)(m)
    assert result.modified and result.count == 2
    assert sorted(map(id, result.removed)) == sorted(map(id, casts))  # (the very nodes the graph held)
    assert list(m.graph.node) == [kept] and m.graph.node[0] is kept
    onnx.checker.check_model(m, full_check=True)
    np.testing.assert_array_equal(run(m, {"x": X16})[0], np.maximum(X16, 0))


def test_remove_unused_casts_keeps_a_candidate_something_still_reads():
    m = _chain(F16, F32, F16)
    before = m.SerializeToString()
    result = RemoveUnusedCasts({"c0", "c1"})(m)  # (nothing bypassed them: Relu and cast1 read them)
    assert not result.modified and result.count == 0 and result.removed == []
    assert m.SerializeToString() == before


def test_a_cast_that_writes_a_graph_output_is_never_bypassed():
    m = model([helper.make_node("Cast", ["x"], ["y"], name="cast", to=F32)], [value("x")], [value("y")])
    for bypass in (RemoveIdentityCasts(), FoldCastRoundTrips()):
        assert not bypass(m).modified
    assert [n.op_type for n in m.graph.node] == ["Cast"]


def test_clean_up_runs_the_passes_in_order_and_counts_each():
    m = _chain(F16, F32, F16, F16)  # (a round trip, then a Cast to the type it has)
    done = clean_up(m)
    assert done.counts == {"FoldCastRoundTrips": 1, "RemoveIdentityCasts": 1, "RemoveUnusedCasts": 3}
    assert len(done.removed) == 3 and [n.op_type for n in m.graph.node] == ["Relu"] and _relu_input(m) == "x"
    np.testing.assert_array_equal(run(m, {"x": X16})[0], np.maximum(X16, 0))
