"""Op-type data: the kinds of operator the classifier and the rewrite treat
apart (quantized ops, control flow, sources, exact ops, ...), the levels
and list profiles, and :class:`OpLists`, the white, black and follow lists
in force for one conversion (op_profiles.py builds them).

Op names are ONNX op types of the default domain (``Conv``) or, for any other
domain, ``domain::OpType`` (``com.microsoft::FusedConv``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

BATCHNORM = "BatchNormalization"

MS = "com.microsoft::"


def ms_ops(names: str) -> list[str]:
    """com.microsoft keys of space-separated op types."""
    return [MS + op for op in names.split()]


# onnxruntime's quantized ops: integer or block-quantized weights, never touched.
ORT_QUANTIZED_OPS = frozenset(
    ms_ops(
        "MatMulNBits MatMulNBitsMlp MatMulNBitsQkv MatMulBnb4 MatMulFpQ4 MatMulBlockQuantizedFp4Weight "
        "MatMulBlockQuantizedFp8Weight GemmFloat8 DynamicQuantizeMatMul DynamicQuantizeLSTM MatMulIntegerToFloat "
        "MatMulInteger16 MulInteger ReduceSumInteger QAttention QEmbedLayerNormalization QGemm QMoE QLinearAdd "
        "QLinearAveragePool QLinearConcat QLinearConv QLinearGlobalAveragePool QLinearLeakyRelu QLinearMul "
        "QLinearReduceMean QLinearSigmoid QLinearSoftmax QLinearWhere QOrderedAttention QOrderedGelu "
        "QOrderedLayerNormalization QOrderedLongformerAttention QOrderedMatMul QuantizeLinear DequantizeLinear "
        "QuantizeWithOrder DequantizeWithOrder QuantizeBFP DequantizeBFP GatherBlockQuantized"
    )
)


# --------------------------------------------------------------------------
# ops the lists do not govern
# --------------------------------------------------------------------------

# Integer / quantized computation: never touched.
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
    }
)

# Control flow: the node keeps its interface types; its subgraphs are converted.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# "Source" ops create float data from non-float inputs or from nothing; their
# output dtype is an attribute, which is rewritten when all (O1) or some (O2/O3)
# consumers run low. Value: the attribute holding the output dtype.
DTYPE_ATTRIBUTE_OPS: dict[str, str] = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
    "HannWindow": "output_datatype",
    "HammingWindow": "output_datatype",
    "BlackmanWindow": "output_datatype",
    "MelWeightMatrix": "output_datatype",
}
# Ops that make a constant from a tensor attribute of theirs (``value``).
VALUE_ATTRIBUTE_OPS = frozenset({"Constant", "ConstantOfShape"})
# Ops that make an empty sequence or optional of a type an attribute names.
CONTAINER_TYPE_ATTRIBUTE_OPS = frozenset({"SequenceEmpty", "Optional"})

# Ops whose result is exact in any float precision (they move, pick or
# compare values): the per-node diff never names them as adding error.
EXACT_OPS = frozenset(
    {
        "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Gather",
        "GatherElements", "GatherND", "Slice", "Concat", "Split", "Pad", "Relu", "Max", "Min", "MaxPool",
        "ReduceMax", "ReduceMin", "Neg", "Abs", "Where", "DepthToSpace", "SpaceToDepth",
    }
)  # fmt: skip

# Ops that choose elements by comparing values: a rounding difference between
# two near-equal values changes the choice. Validation pins these choices to
# the reference's (see pin.py). Value: (output slot of the chosen indices,
# input slots of the values it decides from).
SELECTION_OPS: dict[str, tuple[int, tuple[int, ...]]] = {
    "TopK": (1, (0,)),
    "NonMaxSuppression": (0, (0, 1)),
    "NonZero": (0, (0,)),
    "ArgMax": (0, (0,)),
    "ArgMin": (0, (0,)),
}

# Ops whose schema admits fp16/bf16 but for which onnxruntime (1.31, CPU
# provider) has no fp16 or bf16 kernel: a model with them low does not load.
# They stay fp32 at every level (a --force-low still lowers them).
NO_LOW_KERNEL_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike"})
SOURCE_OPS = frozenset(DTYPE_ATTRIBUTE_OPS) | VALUE_ATTRIBUTE_OPS

# Inputs read only for their shape or converted anyway: any float version of
# the tensor will do, so no Cast is inserted in front of them. (Not the input
# of EyeLike and Random*Like: without a dtype attribute their output takes
# its type, and before opset 22 their schemas admit no bfloat16 input.)
DTYPE_AGNOSTIC_INPUTS: dict[str, tuple[int, ...]] = {
    "Cast": (0,),
    "Shape": (0,),
    "Size": (0,),
}
# Of those, the inputs converted to the type a "to" attribute names. Data a
# node computed low reads the same either way; but a value that exists in
# fp32 (a constant, data resolved from its consumers) must reach them in fp32
# unless they convert to the low dtype: a Cast to int64 of 2049 rounded to
# fp16 gives 2048.
CONVERTED_INPUTS = frozenset({"Cast"})

# Ops that pass a constant's values through unchanged: they move, pick,
# repeat or pad them (so a constant behind them still reaches the consumer as
# it is). Value: the inputs whose values they pass on (None: every input):
# the data, and Pad's constant_value, the scatters' updates and both
# branches of Where (its condition is no value it passes on).
PASS_THROUGH_OPS: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        (
            "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Gather",
            "GatherElements", "GatherND", "Slice", "Split", "Compress", "Unique", "ReverseSequence", "Trilu",
            "CenterCropPad", "DepthToSpace", "SpaceToDepth", "Cast",
        ),
        (0,),
    ),
    "Concat": None,
    "Pad": (0, 2),
    "Scatter": (0, 2),
    "ScatterElements": (0, 2),
    "ScatterND": (0, 2),
    "TensorScatter": (0, 1),
    "Where": (1, 2),
}  # fmt: skip
# Of those, the ones that may hold a value of their own, passed on with the
# data, in a float attribute: Pad before opset 11 pads with its ``value``
# (an input, constant_value, from opset 11 on) in its constant mode.
PASS_THROUGH_ATTRIBUTES: dict[str, str] = {"Pad": "value"}
# Of those, the input a node reads only in its constant mode (its ``mode``
# attribute absent or "constant"): Pad's constant_value, which the reflect,
# edge and wrap modes never read (they pad with values of the data), so its
# values neither reach the output nor keep the node fp32 there.
CONSTANT_MODE_INPUTS: dict[str, int] = {"Pad": 2}

# Attention inputs (by their schema names: onnxruntime's attention family,
# ONNX's Attention) that carry an additive mask. Their very negative values
# (float32's lowest: a framework's stand-in for -inf) only zero a
# probability, which the low dtype's -inf or lowest value does as well: the
# range rules do not keep the attention op fp32 for them.
ATTENTION_MASK_INPUTS = frozenset({"attention_bias", "attn_mask"})

LEVELS = ("O0", "O1", "O2", "O3")
PROFILES = ("default", "mindspore", "paddle")


@dataclass(frozen=True)
class OpLists:
    """The lists in force for one conversion (after profile, level, dtype and
    user additions are applied). Values are the reason shown in the plan."""

    profile: str
    white: Mapping[str, str]
    black: Mapping[str, str]
    follow: Mapping[str, str]
    unlisted_follow: bool  # True: unlisted ops follow their data (Paddle's promote)
    notes: tuple[str, ...] = field(default=())

    def kind(self, op: str) -> str:
        """'white', 'black', 'follow' or 'unlisted'."""
        if op in self.black:
            return "black"
        if op in self.white:
            return "white"
        if op in self.follow:
            return "follow"
        return "unlisted"
