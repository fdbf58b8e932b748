"""The operator lists: data in one place, valid ONNX op types, profile semantics."""

from __future__ import annotations

import pytest

from amp_convert import op_profiles
from amp_convert.schema import known_default_ops


@pytest.mark.parametrize(
    "table",
    [
        op_profiles.DEFAULT_WHITE,
        op_profiles.DEFAULT_BLACK,
        op_profiles.DEFAULT_FOLLOW,
        op_profiles.MINDSPORE_WHITE,
        op_profiles.MINDSPORE_BLACK,
        op_profiles.PADDLE_FP16_WHITE,
        op_profiles.PADDLE_BF16_WHITE,
        op_profiles.PADDLE_FP16_BLACK,
        op_profiles.PADDLE_EXTRA_BLACK,
    ],
)
def test_every_listed_op_is_an_onnx_op_with_a_reason(table):
    assert set(table) <= known_default_ops()
    assert all(reason.strip() for reason in table.values())


def test_default_lists_are_disjoint():
    white, black, follow = set(op_profiles.DEFAULT_WHITE), set(op_profiles.DEFAULT_BLACK), set(op_profiles.DEFAULT_FOLLOW)
    assert not (white & black) and not (white & follow) and not (black & follow)


def test_mindspore_profile_is_the_seed_lists_mapped_exactly():
    white, black, _, unlisted_follow = op_profiles.builtin_lists("mindspore", "O1", "fp16")
    # (onnxruntime's fused ops join them as the standard op they fuse: see test_ort_schemas)
    assert set(white) - set(op_profiles.ORT_FUSED) == {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "LSTM",
        "GRU",
        "RNN",
        "PRelu",
        "Relu",
    }
    assert set(black) - set(op_profiles.ORT_FUSED) == {"BatchNormalization", "LayerNormalization"}
    assert not unlisted_follow


def test_paddle_profile_depends_on_level_and_dtype():
    _, black_o1, _, unlisted_follow = op_profiles.builtin_lists("paddle", "O1", "fp16")
    _, black_o2, _, _ = op_profiles.builtin_lists("paddle", "O2", "fp16")
    white_bf16, black_bf16, _, _ = op_profiles.builtin_lists("paddle", "O1", "bf16")
    assert {"Softmax", "Exp", "LayerNormalization", "Resize", "Gather"} <= set(black_o1)
    assert "Softmax" not in black_o2 and {"Resize", "Gather", "ScatterND"} <= set(black_o2)
    assert set(white_bf16) - set(op_profiles.ORT_FUSED) == {"Conv", "Einsum", "MatMul"}
    assert "Softmax" not in black_bf16
    assert unlisted_follow


def test_custom_lists_move_ops_between_lists():
    resolved = op_profiles.resolve_lists("default", "O2", "fp16", white_list=["Softmax"], black_list=["Relu"])
    assert resolved.kind("Softmax") == "white" and resolved.kind("Relu") == "black"
    assert any("Softmax moved" in n for n in resolved.notes)
    with pytest.raises(ValueError, match="both"):
        op_profiles.resolve_lists("default", "O2", "fp16", white_list=["Add"], black_list=["Add"])


def test_only_lists_replace_the_builtin_ones():
    only_white = op_profiles.resolve_lists("default", "O1", "fp16", only_white_list=["Add"])
    assert set(only_white.white) == {"Add"} and not only_white.black
    only_black = op_profiles.resolve_lists("default", "O2", "fp16", only_black_list=["Conv"])
    assert set(only_black.black) == {"Conv"}


def test_keep_batchnorm_switch():
    assert op_profiles.resolve_lists("default", "O3", "fp16").kind("BatchNormalization") != "black"
    assert op_profiles.resolve_lists("default", "O3", "fp16", keep_batchnorm_fp32=True).kind("BatchNormalization") == "black"
    assert op_profiles.resolve_lists("mindspore", "O2", "fp16", keep_batchnorm_fp32=False).kind("BatchNormalization") != "black"


def test_an_explicit_keep_batchnorm_switch_holds_with_an_only_black_list():
    """The only-list replaces the default black list, BatchNormalization's
    default place included, but not a switch the user gave."""
    replaced = op_profiles.resolve_lists("default", "O2", "fp16", only_black_list=["Softmax"])
    assert replaced.kind("BatchNormalization") != "black"
    kept = op_profiles.resolve_lists("default", "O2", "fp16", only_black_list=["Softmax"], keep_batchnorm_fp32=True)
    assert kept.kind("BatchNormalization") == "black" and kept.kind("Softmax") == "black"
