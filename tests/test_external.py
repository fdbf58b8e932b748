"""Models with external data: read lazily, written tensor by tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import init, local_function_model, model, value
from onnx import helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from amp_convert.external import external_info, is_external

RNG = np.random.default_rng(7)


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def build(folder: Path) -> Path:
    """MatMul chain with 64x64 weights forced into an external file; W_shared
    also feeds a Softmax (black list), so it stays fp32 and is copied as is."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["h2", "W_shared"], ["h3"], name="mm3"),
        helper.make_node("Softmax", ["W_shared"], ["sw"], name="sm", axis=-1),
        helper.make_node("MatMul", ["h3", "sw"], ["y"], name="mm4"),
    ]
    inits = [init(n, (RNG.standard_normal((64, 64)) * 0.2).astype(np.float32)) for n in ("W1", "W2", "W_shared")]
    m = model(nodes, [value("x", shape=(4, 64))], [value("y", shape=(4, 64))], inits)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=1024)
    return path


def run_path(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.fixture
def source(tmp_path) -> Path:
    return build(tmp_path / "in")


def test_external_input_gives_external_output_with_half_the_data(source, tmp_path):
    before = {p.name: p.read_bytes() for p in source.parent.iterdir()}
    out = tmp_path / "out" / "model.fp16.onnx"
    out.parent.mkdir()
    proc = cli(str(source), "--level", "O2", "-o", str(out), "--samples", "2")
    assert proc.returncode == 0, proc.stderr
    data = out.with_name("model.fp16.onnx.data")
    assert data.is_file()
    converted = onnx.load(str(out), load_external_data=False)
    tensors = {t.name: t for t in converted.graph.initializer}
    assert all(is_external(t) and external_info(t)["location"] == data.name for t in tensors.values())
    assert tensors["W1"].data_type == onnx.TensorProto.FLOAT16
    assert tensors["W_shared"].data_type == onnx.TensorProto.FLOAT  # shared with the fp32 Softmax: copied as it was
    fp32_bytes = (source.parent / "weights.bin").stat().st_size
    assert data.stat().st_size < 0.9 * fp32_bytes  # two of three weights halved
    onnx.checker.check_model(str(out), full_check=True)
    loaded = onnx.load(str(out))
    original = onnx.load(str(source))
    shared = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    original_shared = next(t for t in original.graph.initializer if t.name == "W_shared")
    assert np.array_equal(shared["W_shared"], numpy_helper.to_array(original_shared))
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(source, x), run_path(out, x)
    assert np.max(np.abs(ref - got)) <= 1e-2 * np.max(np.abs(ref)) + 1e-3
    assert {p.name: p.read_bytes() for p in source.parent.iterdir()} == before  # input untouched


def test_external_data_never_writes_one_file(source, tmp_path):
    out = tmp_path / "single.onnx"
    proc = cli(str(source), "-o", str(out), "--external-data", "never", "--no-validate")
    assert proc.returncode == 0, proc.stderr
    assert not out.with_name("single.onnx.data").exists()
    assert not any(is_external(t) for t in onnx.load(str(out)).graph.initializer)


def test_external_data_always_on_an_inline_model(tmp_path):
    inline = tmp_path / "inline.onnx"
    m = onnx.load(str(build(tmp_path / "src")))
    onnx.load_external_data_for_model(m, str(tmp_path / "src"))
    onnx.save(m, str(inline))
    out = tmp_path / "ext.onnx"
    proc = cli(str(inline), "-o", str(out), "--external-data", "always", "--no-validate")
    assert proc.returncode == 0, proc.stderr
    assert out.with_name("ext.onnx.data").is_file()
    onnx.checker.check_model(str(out), full_check=True)


def test_lazy_load_keeps_tensors_on_disk(source):
    from amp_convert.load import load_model

    lazy = load_model(source, lazy_external=True)
    assert all(is_external(t) for t in lazy.graph.initializer)
    eager = load_model(source)
    assert not any(is_external(t) for t in eager.graph.initializer)


def test_a_location_through_a_folder_and_back_converts(source, tmp_path):
    """``sub/../weights.bin`` with ``sub`` a folder beside the model: onnx
    and onnxruntime both open it, so the converter does too (without
    ``sub``, the system cannot: see test_hardening)."""
    (source.parent / "sub").mkdir()
    m = onnx.load(str(source), load_external_data=False)
    for tensor in m.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "sub/../weights.bin"
    onnx.save(m, str(source))
    onnx.checker.check_model(str(source), full_check=True)
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    proc = cli(str(source), "-o", str(out), "-q", "--samples", "2")  # (validation: onnxruntime loads the input)
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(out), full_check=True)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(source, x), run_path(out, x)
    assert np.max(np.abs(ref - got)) <= 1e-2 * np.max(np.abs(ref)) + 1e-3


def build_external_constants(folder: Path) -> Path:
    """Constant and ConstantOfShape-fed graph whose Constant values (tensor
    attributes, not initializers) live in the external data file."""
    w1 = numpy_helper.from_array((RNG.standard_normal((64, 64)) * 0.2).astype(np.float32), "w1_value")
    w2 = numpy_helper.from_array((RNG.standard_normal((64, 64)) * 0.2).astype(np.float32), "w2_value")
    nodes = [
        helper.make_node("Constant", [], ["w1"], name="c1", value=w1),
        helper.make_node("Constant", [], ["w2"], name="c2", value=w2),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Softmax", ["w2"], ["sw"], name="sm", axis=-1),  # black list: w2 stays fp32
        helper.make_node("MatMul", ["h", "sw"], ["y"], name="mm2"),
    ]
    m = model(nodes, [value("x", shape=(4, 64))], [value("y", shape=(4, 64))])
    convert_model_to_external_data(m, location="consts.bin", size_threshold=1024, convert_attribute=True)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(m, str(path))
    assert (folder / "consts.bin").stat().st_size >= 2 * 64 * 64 * 4
    return path


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_constants_held_in_external_data_are_read_converted_and_written(level, tmp_path):
    source = build_external_constants(tmp_path / "in")
    before = {p.name: p.read_bytes() for p in source.parent.iterdir()}
    out = tmp_path / "out.onnx"
    proc = cli(str(source), "--level", level, "-o", str(out), "--samples", "2")
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(out), full_check=True)
    converted = onnx.load(str(out), load_external_data=False)
    constants = [n for n in converted.graph.node if n.op_type == "Constant"]
    values = {n.name: next(a.t for a in n.attribute if a.name == "value") for n in constants}
    low = level != "O0"
    assert values["c1"].data_type == (onnx.TensorProto.FLOAT16 if low else onnx.TensorProto.FLOAT)
    assert values["c2"].data_type == onnx.TensorProto.FLOAT
    # The fp32 one still lives in a data file beside the output, not the input's.
    assert is_external(values["c2"]) and external_info(values["c2"])["location"] == "out.onnx.data"
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(source, x), run_path(out, x)
    assert np.max(np.abs(ref - got)) <= (1e-2 * np.max(np.abs(ref)) + 1e-3 if low else 0)
    assert {p.name: p.read_bytes() for p in source.parent.iterdir()} == before


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_external_weights_are_converted_as_they_are_written_exactly_and_counted(dtype, tmp_path):
    """Weights in external data are retyped in memory and converted chunk by
    chunk while the output's data file is written: the bytes equal numpy's
    own conversion, values flushed to zero are counted as for inline
    weights, and a weight with values to clip (--clip-initializers) is
    clipped and counted."""
    import ml_dtypes

    low = np.float16 if dtype == "fp16" else ml_dtypes.bfloat16
    tiny = (RNG.standard_normal((64, 64)) * 0.2).astype(np.float32)
    tiny[0, :5] = 1e-9 if dtype == "fp16" else 1e-45  # flush to zero in the low type
    big = (RNG.standard_normal((64, 64)) * 0.2).astype(np.float32)
    big[1, :3] = np.finfo(np.float32).max if dtype == "bf16" else 1e5  # beyond the low type's largest value
    nodes = [
        helper.make_node("MatMul", ["x", "W_tiny"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "W_big"], ["y"], name="mm2"),
    ]
    m = model(nodes, [value("x", shape=(4, 64))], [value("y", shape=(4, 64))], [init("W_tiny", tiny), init("W_big", big)])
    folder = tmp_path / "in"
    folder.mkdir()
    source = folder / "model.onnx"
    onnx.save(m, str(source), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=1024)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    args = [str(source), "--dtype", dtype, "-o", str(out), "--no-validate", "--report", str(report), "-q"]
    proc = cli(*args, "--clip-initializers")
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(out), full_check=True)
    written = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    expected_tiny = tiny.astype(low)
    got_tiny = numpy_helper.to_array(written["W_tiny"])
    assert got_tiny.dtype == np.dtype(low) and got_tiny.tobytes() == expected_tiny.tobytes()
    got_big = numpy_helper.to_array(written["W_big"]).astype(np.float32)
    largest = float(ml_dtypes.finfo(low).max)
    assert np.all(got_big[1, :3] == np.float32(largest))  # clipped, not inf
    rewrite = json.loads(report.read_text())["conversion"]["rewrite"]
    assert rewrite["flushed"] == {"W_tiny": 5} and rewrite["clipped"] == {"W_big": 3}


def test_external_output_is_byte_identical_across_runs(source, tmp_path):
    """The model and its data file, written twice (retyped weights converted as they are written)."""
    written = []
    for run_name in ("a", "b"):
        folder = tmp_path / run_name
        folder.mkdir()
        proc = cli(str(source), "--level", "O2", "-o", str(folder / "m.onnx"), "--no-validate", "-q")
        assert proc.returncode == 0, proc.stderr
        written.append({p.name: p.read_bytes() for p in sorted(folder.iterdir())})
    assert sorted(written[0]) == ["m.onnx", "m.onnx.data"]
    assert written[0] == written[1]


def _external(name: str, array: np.ndarray, data: Path, offset: int) -> onnx.TensorProto:
    """A TensorProto whose values live at ``offset`` of the file ``data``."""
    tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, text in (("location", data.name), ("offset", str(offset)), ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, text
    return tensor


def test_same_named_weights_of_sibling_branches_are_judged_each_on_its_own(tmp_path):
    """Both If branches hold an external weight named "w": 0.5 in one, 1e6
    (beyond fp16) in the other. At O3 each is converted on its own values:
    the large one clipped and counted, not written as inf."""
    folder = tmp_path / "in"
    folder.mkdir()
    data = folder / "m.onnx.data"
    small, large = np.full((1, 8), 0.5, np.float32), np.full((1, 8), 1e6, np.float32)
    data.write_bytes(small.tobytes() + large.tobytes())

    def branch(label: str, offset: int) -> onnx.GraphProto:
        mul = helper.make_node("Mul", ["x", "w"], [f"y_{label}"], name=f"mul_{label}")
        return helper.make_graph([mul], label, [], [value(f"y_{label}", shape=(1, 8))], [_external("w", small, data, offset)])

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="gt"),
        helper.make_node(
            "If", ["positive"], ["y"], name="if", then_branch=branch("then", small.nbytes), else_branch=branch("else", 0)
        ),
    ]
    graph = helper.make_graph(
        nodes, "g", [value("x", shape=(1, 8))], [value("y", shape=(1, 8))], [init("zero", np.array(0, np.float32))]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(folder / "m.onnx"))
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    proc = cli(str(folder / "m.onnx"), "--level", "O3", "-o", str(out), "--no-validate", "--report", str(report), "-q")
    assert proc.returncode == 0, proc.stderr
    written = onnx.load(str(out))
    if_node = next(n for n in written.graph.node if n.op_type == "If")
    branches = {a.name: numpy_helper.to_array(a.g.initializer[0]) for a in if_node.attribute}
    assert np.all(branches["else_branch"] == np.float16(0.5))
    assert np.all(branches["then_branch"] == np.finfo(np.float16).max)  # clipped, not inf
    assert json.loads(report.read_text())["conversion"]["rewrite"]["clipped"] == {"w": 8}


def test_an_empty_external_weight_is_written_inline_and_the_output_loads(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    weight = (RNG.standard_normal((8, 8)) * 0.2).astype(np.float32)
    (folder / "m.onnx.data").write_bytes(weight.tobytes())
    empty = _external("E", np.zeros((0, 8), np.float32), folder / "m.onnx.data", weight.nbytes)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Concat", ["E", "h"], ["y"], name="cat", axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", shape=(4, 8))],
        [value("y", shape=(4, 8))],
        [_external("W", weight, folder / "m.onnx.data", 0), empty],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(folder / "m.onnx"))
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    proc = cli(str(folder / "m.onnx"), "--level", "O3", "-o", str(out), "--external-data", "always", "--no-validate", "-q")
    assert proc.returncode == 0, proc.stderr
    tensors = {t.name: t for t in onnx.load(str(out), load_external_data=False).graph.initializer}
    assert is_external(tensors["W"]) and not is_external(tensors["E"])
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    assert run_path(out, x).shape == (4, 8)  # loads and runs in onnxruntime


def test_auto_on_a_model_with_external_data(source, tmp_path):
    out = tmp_path / "auto" / "model.onnx"
    out.parent.mkdir()
    proc = cli(str(source), "--level", "auto", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert out.with_name("model.onnx.data").is_file()
    onnx.checker.check_model(str(out), full_check=True)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(source, x), run_path(out, x)
    assert np.max(np.abs(ref - got)) <= 1e-2 * np.max(np.abs(ref)) + 1e-3


def test_compare_counts_the_external_data_of_both_models(source, tmp_path):
    """compare's sizes are those convert reports: the .onnx file and its data file."""
    out = tmp_path / "out" / "model.fp16.onnx"
    out.parent.mkdir()
    converted = cli(str(source), "-o", str(out), "--external-data", "always", "--report", str(tmp_path / "c.json"), "-q")
    assert converted.returncode == 0, converted.stderr
    proc = cli("compare", str(source), str(out), "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    size = json.loads((tmp_path / "r.json").read_text())["size"]
    assert size["before_bytes"] == sum(p.stat().st_size for p in source.parent.iterdir())
    assert size["after_bytes"] == sum(p.stat().st_size for p in out.parent.iterdir())
    assert size == json.loads((tmp_path / "c.json").read_text())["size"]


def test_a_local_functions_external_constant_is_read_in_and_the_output_loads_elsewhere(tmp_path):
    """A Constant in a local function, its value in the input's data file:
    the converter leaves functions as they are, so the value is read in and
    written inline; the output, in another folder, does not point at the
    input's data file (it did, and loaded nowhere else)."""
    m = local_function_model(64, 4, opset=17, ir_version=8)
    (tmp_path / "in").mkdir()
    src = tmp_path / "in" / "m.onnx"
    onnx.save(m, str(src), save_as_external_data=True, location="w.bin", size_threshold=0, convert_attribute=True)
    assert any(
        t.data_location == onnx.TensorProto.EXTERNAL
        for t in [n.attribute[0].t for n in onnx.load(str(src), load_external_data=False).functions[0].node[:1]]
    )
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    proc = cli(str(src), "--level", "O2", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    written = onnx.load(str(out), load_external_data=False)
    assert written.functions[0].node[0].attribute[0].t.data_location == onnx.TensorProto.DEFAULT
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    assert np.allclose(run_path(out, x), x, atol=0.05)


@pytest.mark.parametrize("how", [["--target-opset", "13"], ["--dtype", "bf16"]])
def test_an_opset_upgrade_of_a_model_with_external_data_leaves_the_weights_on_disk(how, tmp_path):
    """An upgrade from opset 10 or below looks for the scales of the
    Resize nodes it mends: it read every initializer, external ones
    included, without the model's folder (an internal error, exit 3)."""
    folder = tmp_path / "in"
    folder.mkdir()
    scales = init("s", np.array([1, 1, 2, 2], np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Reshape", ["h", "shape"], ["r"], name="rs"),
        helper.make_node("Upsample", ["r", "s"], ["y"], name="up", mode="nearest"),
    ]
    inits = [
        init("W", (RNG.standard_normal((64, 64)) * 0.2).astype(np.float32)),
        init("shape", np.array([1, 1, 8, 8], np.int64)),
        scales,
    ]
    m = model(nodes, [value("x", shape=(1, 64))], [value("y", shape=(1, 1, 16, 16))], inits, opset=9)
    onnx.save(m, str(folder / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=1024)
    out = tmp_path / "out.onnx"
    proc = cli(str(folder / "m.onnx"), "-o", str(out), "--no-validate", "-q", *how)
    assert proc.returncode == 0, proc.stderr
    converted = onnx.load(str(out))
    assert converted.opset_import[0].version == 13
    if "bf16" not in how:
        x = RNG.standard_normal((1, 64)).astype(np.float32)
        ref = ort.InferenceSession(str(folder / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert np.allclose(run_path(out, x), ref, rtol=1e-2, atol=1e-2)


def test_an_upgrade_that_would_read_resize_scales_from_external_data_says_so(tmp_path):
    """A nearest Resize-10 needs its scales read to be upgraded faithfully:
    in external data (every tensor saved there), the refusal says where they
    are, not that they are not constant."""
    nodes = [helper.make_node("Resize", ["x", "s"], ["y"], name="up", mode="nearest")]
    inits = [init("s", np.array([1, 1, 2, 2], np.float32))]
    m = model(nodes, [value("x", shape=(1, 1, 4, 4))], [value("y", shape=(1, 1, 8, 8))], inits, opset=10)
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    proc = cli(str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx"), "--no-validate", "--target-opset", "13")
    assert proc.returncode == 2 and "'up'" in proc.stderr and "its scales are in external data" in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def _sparse_constant_model(folder: Path, values_location: str | None) -> tuple[Path, np.ndarray]:
    """x @ S @ W: S a Constant's sparse_value (300 of 64x64); its values in
    the file ``values_location`` (None: inline); W in ``w.bin``."""
    n = 64
    dense = np.zeros((n, n), np.float32)
    where = np.sort(RNG.choice(n * n, 300, replace=False))
    dense.flat[where] = RNG.standard_normal(300).astype(np.float32)
    values = numpy_helper.from_array(dense.flat[where].astype(np.float32), "S")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(where.astype(np.int64), "S_idx"), [n, n])
    if values_location is not None:
        (folder / values_location).write_bytes(values.raw_data)
        values = sparse.values
        values.ClearField("raw_data")
        values.data_location = onnx.TensorProto.EXTERNAL
        entry = values.external_data.add()
        entry.key, entry.value = "location", values_location
    nodes = [
        helper.make_node("Constant", [], ["S"], name="s", sparse_value=sparse),
        helper.make_node("MatMul", ["x", "S"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "W"], ["y"], name="mm2"),
    ]
    weight = (RNG.standard_normal((n, n)) * 0.2).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [value("x", shape=(4, n))], [value("y", shape=(4, n))], [init("W", weight)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = folder / "m.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="w.bin", size_threshold=1024)
    return path, dense


@pytest.mark.parametrize("how", [[], ["--external-data", "never", "--no-validate"]])
def test_a_sparse_constants_external_values_are_carried_to_the_output(how, tmp_path):
    """A Constant's sparse_value whose values are in external data: a valid
    model (full checker, onnxruntime). Its values are checked, copied into
    the output's data file (or read in with --external-data never) like any
    tensor; the output, in another folder, no longer points at the input's
    file (it did: onnxruntime could not load the validation copy, exit 2,
    and --no-validate wrote nothing, exit 3)."""
    (tmp_path / "in").mkdir()
    src, _ = _sparse_constant_model(tmp_path / "in", "sv.bin")
    onnx.checker.check_model(str(src), full_check=True)
    before = {p.name: p.read_bytes() for p in src.parent.iterdir()}
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    proc = cli(str(src), "-o", str(out), "-q", *how)
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in src.parent.iterdir()} == before
    written = onnx.load(str(out), load_external_data=False).graph.node
    (values,) = [a.sparse_tensor.values for n in written for a in n.attribute if a.name == "sparse_value"]
    assert [e.value for e in values.external_data if e.key == "location"] == ([] if how else ["o.onnx.data"])
    onnx.checker.check_model(str(out), full_check=True)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(src, x), run_path(out, x)
    assert np.max(np.abs(ref - got)) <= 1e-2 * np.max(np.abs(ref)) + 1e-3


def test_a_sparse_constants_values_outside_the_models_folder_are_refused(tmp_path):
    (tmp_path / "in").mkdir()
    src, _ = _sparse_constant_model(tmp_path / "in", "sv.bin")
    (tmp_path / "sv.bin").write_bytes((tmp_path / "in" / "sv.bin").read_bytes())
    m = onnx.load(str(src), load_external_data=False)
    m.graph.node[0].attribute[0].sparse_tensor.values.external_data[0].value = "../sv.bin"
    onnx.save(m, str(src))
    proc = cli(str(src), "-o", str(tmp_path / "o.onnx"), "--no-validate", "--check", "none")
    assert proc.returncode == 2 and "points outside the model's folder" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()


def test_a_sparse_constant_is_calibrated_and_validated(tmp_path):
    """onnxruntime returns a sparse Constant's output as a SparseTensor, not
    an array: runs read it as its dense array (calibration stopped with an
    internal error, exit 3)."""
    src, _ = _sparse_constant_model(tmp_path, None)
    proc = cli(str(src), "-o", str(tmp_path / "o.onnx"), "-q")
    assert proc.returncode == 0, proc.stderr
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    ref, got = run_path(src, x), run_path(tmp_path / "o.onnx", x)
    assert np.max(np.abs(ref - got)) <= 1e-2 * np.max(np.abs(ref)) + 1e-3


def test_a_refusal_of_a_model_read_from_a_temporary_copy_does_not_name_that_copy(source):
    """onnxruntime reads a model with external data from a copy written to a
    temporary folder, gone by the time its refusal is shown: the message
    calls it that, not by a path nobody can open."""
    from amp_convert.errors import LoadFailure
    from amp_convert.runner import load_refusal, session

    refused = onnx.load(str(source), load_external_data=False)
    refused.ir_version = 99  # (newer than any onnxruntime reads)
    with pytest.raises(LoadFailure) as caught:
        session(refused, "cpu", source.parent)
    said = load_refusal(refused, "cpu", source.parent)
    for message in (caught.value.detail, said):
        assert "a temporary copy of the model" in message and "amp-convert-" not in message, message
