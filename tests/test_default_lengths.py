"""Generated token inputs get a realistic sequence, not 1: an encoder the
longest its position table takes, a KV-cache decoder new and past tokens
with a mask over both; tried on the fp32 model, 1 where nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import I64, init, model, value
from onnx import helper

from amp_convert.cli import main
from amp_convert.input_roles import InputRole
from amp_convert.input_specs import InputSpec
from amp_convert.inputs import make_source
from amp_convert.token_lengths import DEFAULT_TOKENS, choose_lengths

ROOT = Path(__file__).resolve().parents[1]
BERT, GPT2, GPT2_PAST = ROOT / "models/zoo/bert.onnx", ROOT / "models/zoo/gpt2.onnx", ROOT / "models/zoo/ort/gpt2_past.onnx"


def _convert(path: Path, tmp_path: Path, capsys) -> tuple[int, str, dict]:
    """Convert ``path`` (O2 fp16, validated) with no input option: exit code, the inputs: line, the report."""
    report = tmp_path / "r.json"
    code = main([str(path), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "--no-per-node"])
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("inputs: ")]
    return code, line, json.loads(report.read_text())


def _samples(path: Path) -> list[dict[str, np.ndarray]]:
    return list(make_source(onnx.load(str(path))))


def test_an_encoder_gets_the_longest_sequence_its_position_table_takes(tmp_path, capsys):
    """The zoo BERT's position table has 64 rows: 128 tokens fail on the
    fp32 model, 64 run; the mask (gathered by position on its way to the
    scores) is all ones, the ids range over the 1,000-row vocabulary."""
    code, line, report = _convert(BERT, tmp_path, capsys)
    assert code == 0, line
    assert line.startswith("inputs: 2 generated sample(s) (batch=1, sequence=64; --input-shape sets them): ")
    assert "input_ids int64[1x64] [0, 1000)" in line and "attention_mask int64[1x64] ones" in line
    assert "(batch=1, sequence=128 fails on the fp32 model: Add node" in line
    assert report["validation"]["passed"] and report["inputs"]["generated"][0]["shape"] == [1, 64]
    samples = _samples(BERT)
    ids = np.concatenate([s["input_ids"].ravel() for s in samples])
    assert all(s["attention_mask"].shape == (1, 64) and (s["attention_mask"] == 1).all() for s in samples)
    assert ids.min() >= 0 and ids.max() < 1000 and np.unique(ids).size > 100 and ids.max() > 900


def test_a_decoder_of_fixed_length_keeps_it(tmp_path, capsys):
    code, line, _ = _convert(GPT2, tmp_path, capsys)
    assert code == 0 and line == "inputs: 2 generated sample(s): input_ids int64[1x16] [0, 1000)"
    ids = np.concatenate([s["input_ids"].ravel() for s in _samples(GPT2)])
    assert ids.max() > 500 and np.unique(ids).size > 16  # (the vocabulary, not 0 and 1)


def test_a_kv_cache_decoder_gets_new_and_past_tokens_and_a_mask_over_both(tmp_path, capsys):
    """gpt2_past: seq new tokens, past_seq in the cache, attention_mask over
    total_seq = both, positions after the past, all within its 128-row table."""
    code, line, report = _convert(GPT2_PAST, tmp_path, capsys)
    assert code == 0, line
    assert "(batch=1, seq=64, total_seq=128, past_seq=64; --input-shape sets them)" in line
    assert "input_ids int64[1x64] [0, 512)" in line and "attention_mask int64[1x128] ones" in line
    assert "position_ids int64[1x64] 64, 65, 66, ..." in line and "past_0 float32[2x1x4x64x16]" in line
    assert report["validation"]["passed"]
    for sample in _samples(GPT2_PAST):
        assert (sample["attention_mask"] == 1).all() and sample["attention_mask"].shape == (1, 128)
        assert sample["position_ids"].tolist() == [list(range(64, 128))]
        assert sample["input_ids"].max() < 512 and np.unique(sample["input_ids"]).size > 32


def _specs(*items: tuple[str, tuple]) -> list[InputSpec]:
    return [InputSpec(name, np.dtype(np.float32 if name.startswith("past") else np.int64), shape) for name, shape in items]


ROLES = {
    "input_ids": InputRole("index", "a table", 50257),
    "attention_mask": InputRole("mask", "a Softmax"),
    "position_ids": InputRole("positions", "a table", 1024),
}


@pytest.mark.parametrize(
    ("mask", "ids", "expected"),
    [
        # optimum's decoder with past: the mask's length is a sum of the others' names
        (
            "past_sequence_length + sequence_length",
            ("batch_size", "sequence_length"),
            {"batch_size": 1, "sequence_length": 64, "past_sequence_length + sequence_length": 128, "past_sequence_length": 64},
        ),
        # one new token a step, a fixed 1 in the name: the past fills the rest
        (
            "past_sequence_length + 1",
            ("batch_size", 1),
            {"batch_size": 1, "past_sequence_length + 1": 65, "past_sequence_length": 64},
        ),
        # onnxruntime's GPT-2 export: a total
        (
            "total_sequence_length",
            ("batch_size", "sequence_length"),
            {"batch_size": 1, "sequence_length": 64, "total_sequence_length": 128, "past_sequence_length": 64},
        ),
    ],
)
def test_dimension_names_say_how_the_lengths_relate(mask, ids, expected):
    specs = _specs(
        ("input_ids", ids),
        ("attention_mask", ("batch_size", mask)),
        ("past_key_values.0.key", ("batch_size", 12, "past_sequence_length", 64)),
    )
    roles = {k: v for k, v in ROLES.items() if k != "position_ids"}
    lengths = choose_lengths(specs, roles, {}, DEFAULT_TOKENS)
    assert lengths.dims == expected
    assert choose_lengths(specs, roles, {}, 128, new=1).dims.get("sequence_length", 1) == 1


def test_lengths_follow_what_the_user_settles_and_leave_other_inputs_at_1():
    specs = _specs(
        ("input_ids", ("batch", "seq")),
        ("position_ids", ("batch", "seq")),
        ("attention_mask", ("batch", "total")),
        ("past_0", (2, "batch", 4, "past", 16)),
        ("pixel_values", ("batch", 3, "height", "width")),  # (not a token input: its own dims stay 1)
        ("extra", (None, None)),
    )
    roles = {**ROLES, "extra": InputRole("index", "a table", 10)}
    # given 16 new tokens and a mask of 48, the past holds 32 and positions follow it
    lengths = choose_lengths(specs, roles, {"seq": 16, "total": 48}, DEFAULT_TOKENS)
    assert lengths.dims == {"batch": 1, "past": 32} and lengths.starts == {"position_ids": 32}
    assert lengths.axes == {("extra", 0): 1, ("extra", 1): 16}
    assert "height" not in lengths.dims and lengths.of("pixel_values", 2, "height") == 1
    # an encoder: every token input's sequence is the tokens asked for, and positions start at 0
    encoder = choose_lengths(_specs(("input_ids", ("batch", "sequence"))), ROLES, {}, DEFAULT_TOKENS)
    assert encoder.dims == {"batch": 1, "sequence": 128} and encoder.starts == {}


def test_a_model_that_runs_on_no_longer_sequence_falls_back_to_1(tmp_path, capsys):
    """Token embeddings reshaped to one token's: every longer sequence fails
    on the fp32 model, so every dynamic dimension is 1, as it was, and the
    inputs: line says why; the conversion validates."""
    table = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["e"]),
        helper.make_node("Reshape", ["e", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "W"], ["y"]),
    ]
    inits = [init("table", table), init("shape", np.array([1, 8])), init("W", np.eye(8, dtype=np.float32))]
    m = model(nodes, [value("input_ids", I64, ("batch", "seq"))], [value("y", shape=(1, 8))], inits)
    path = tmp_path / "one_token.onnx"
    onnx.save(m, str(path))
    assert make_source(m).generated_shape(make_source(m).specs[0]) == (1, 1)
    code, line, _ = _convert(path, tmp_path, capsys)
    assert code == 0 and "input_ids int64[1x1] [0, 100)" in line
    assert "(every dynamic dimension 1: batch=1, seq=128 fails on the fp32 model: Reshape node" in line
    # not tried (the caller's choice): the first plan stands
    assert make_source(m, try_lengths=False).generated_shape(make_source(m).specs[0]) == (1, 128)


def _conv_model(input_shape: tuple, channels_last: bool = False) -> onnx.ModelProto:
    """A Conv (3 -> 4 channels) over an image input of ``input_shape`` (NCHW, or NHWC transposed first)."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["t" if channels_last else "image", "W"], ["y"], pads=[1, 1, 1, 1])]
    if channels_last:
        nodes.insert(0, helper.make_node("Transpose", ["image"], ["t"], perm=[0, 3, 1, 2]))
    return model(nodes, [value("image", shape=input_shape)], [value("y", shape=(None, None, None, None))], [init("W", w)])


@pytest.mark.parametrize(
    ("shape", "channels_last", "expected"),
    [
        (("batch", 3, "height", "width"), False, (1, 3, 224, 224)),
        ((None, 3, None, None), False, (1, 3, 224, 224)),
        (("N", "H", "W", 3), True, (1, 224, 224, 3)),
        (("p2o.DynamicDimension.0", 3, 32, "w"), False, (1, 3, 32, 224)),  # (a batch named like any other: the first axis)
    ],
)
def test_an_image_input_gets_an_images_size_not_1x1(shape, channels_last, expected):
    """A 1x1 image runs every Conv on its padding and says nothing of real
    inputs: a dynamic image axis is DEFAULT_IMAGE_SIDE (224) long."""
    m = _conv_model(shape, channels_last)
    source = make_source(m)
    assert source.generated_shape(source.specs[0]) == expected
    assert all(s["image"].shape == expected for s in source)


def test_an_image_model_that_fails_at_224_gets_the_largest_side_it_runs_at(tmp_path, capsys):
    """The image reshaped to a fixed 56x56 map: 224 and 112 fail on the
    fp32 model, 56 runs, and the inputs: line says so and why."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["image", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["y"]),
    ]
    inits = [init("W", w), init("shape", np.array([1, 4 * 56 * 56]))]
    m = model(nodes, [value("image", shape=("batch", 3, "h", "w"))], [value("y", shape=(1, 4 * 56 * 56))], inits)
    path = tmp_path / "fixed.onnx"
    onnx.save(m, str(path))
    code, line, report = _convert(path, tmp_path, capsys)
    assert code == 0, line
    assert "image float32[1x3x56x56]" in line and "h=56, w=56" in line
    assert "(h=224, w=224 fails on the fp32 model: Reshape node" in line
    assert report["inputs"]["generated"][0]["shape"] == [1, 3, 56, 56]


def test_a_float_sequence_input_gets_a_sequence_and_a_kv_cache_keeps_its_lengths():
    """A float sequence (the zoo's control-flow model: batch x time x 32)
    gets DEFAULT_TOKENS steps, not 1; a KV cache's past dimension keeps
    the length the token inputs give it (half past, half new)."""
    controlflow = make_source(onnx.load(str(ROOT / "models/zoo/controlflow.onnx")))
    assert controlflow.generated_shape(controlflow.specs[0]) == (1, DEFAULT_TOKENS, 32)
    past = make_source(onnx.load(str(GPT2_PAST)))
    shapes = {s.name: past.generated_shape(s) for s in past.specs}
    assert shapes["past_0"][3] == past.lengths.dims["past_seq"] and shapes["past_0"][3] > 1
    assert shapes["past_0"][1] == 1  # (its batch)


def test_image_and_mask_rules_read_the_dimension_names_and_the_token_inputs():
    """A channel count named so (optimum's pixel_values) is 3 and its
    neighbours an image's sides; a one-channel float input beside token
    inputs is an attention bias (batch, 1, seq, seq): its axes follow the
    tokens, so the plans can run."""
    from amp_convert.token_lengths import length_plans

    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    pixels = [InputSpec("pixel_values", f32, ("batch_size", "num_channels", "height", "width"))]
    first = next(length_plans(pixels, {}, {}))
    assert first.dims == {"num_channels": 3, "height": 224, "width": 224}
    specs = [InputSpec("input_ids", i64, (None, None)), InputSpec("attn_bias", f32, (None, 1, None, None))]
    roles = {"input_ids": InputRole("index", "a Gather", 30522)}
    for plan in list(length_plans(specs, roles, {}))[:-1]:
        assert plan.axes[("attn_bias", 2)] == plan.axes[("attn_bias", 3)] == plan.axes[("input_ids", 1)] > 1
