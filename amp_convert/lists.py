"""Operator lists: all the op-type data the classifier uses, in one place.

Three kinds of operator, as in Paddle and PyTorch autocast:

* white:  compute-heavy and numerically safe in low precision;
* black:  numerically sensitive, kept in float32;
* follow: data movement and cheap element-wise ops that take the precision of
  the data reaching them (so O1 puts no Cast pair around a Reshape between
  two Convs).

Ops in none of the three are "unlisted": float32 at O1, low at O2 (a profile
may say they follow instead, as Paddle's promote rule does).

Three profiles exist. ``default`` is ours, reasoned for ONNX op by op (the
reason strings below are what ``amp-convert lists`` prints). ``mindspore`` is
the seed's AMP_WHITE_LIST / AMP_BLACK_LIST mapped to ONNX op types exactly.
``paddle`` is Paddle's ``paddle/amp/amp_lists.py`` (fp16 and bf16 white lists,
the O1 and O2 black lists) mapped likewise.

Op names are ONNX op types of the default domain (``Conv``) or, for any other
domain, ``domain::OpType`` (``com.microsoft::FusedConv``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# --------------------------------------------------------------------------
# default profile
# --------------------------------------------------------------------------

DEFAULT_WHITE: dict[str, str] = {
    "Conv": "GEMM-bound; tensor cores accumulate in fp32",
    "ConvTranspose": "GEMM-bound like Conv",
    "DeformConv": "Conv with offsets; GEMM-bound",
    "MatMul": "GEMM-bound; the main win of low precision",
    "Gemm": "GEMM-bound (Dense / Linear layers)",
    "Einsum": "contractions lower to GEMMs",
    "Attention": "fused attention kernels are built for low precision",
    "LSTM": "recurrent GEMMs; gates are bounded by sigmoid/tanh",
    "GRU": "recurrent GEMMs; gates are bounded by sigmoid/tanh",
    "RNN": "recurrent GEMMs; activations are bounded",
    "PRelu": "element-wise, no range growth (MindSpore white list)",
    "Relu": "exact in any float type (MindSpore white list)",
}

DEFAULT_BLACK: dict[str, str] = {
    "BatchNormalization": "running variance may exceed fp16; 1/sqrt(var+eps) loses precision",
    "GroupNormalization": "mean/variance reductions",
    "InstanceNormalization": "mean/variance reductions",
    "RMSNormalization": "sum of squares over the hidden size",
    "LpNormalization": "sum of p-th powers overflows",
    "MeanVarianceNormalization": "mean/variance reductions",
    "LRN": "sum of squares across channels",
    "Softmax": "exp of large logits overflows; long sums lose precision",
    "LogSoftmax": "exp / log of large values",
    "Exp": "overflows fp16 above ~11",
    "Log": "inputs near zero; result precision",
    "Pow": "powers overflow or underflow quickly",
    "Reciprocal": "1/x overflows fp16 for |x| < 1.5e-5",
    "ReduceSum": "long sums lose precision and may overflow",
    "ReduceMean": "long sums lose precision",
    "ReduceProd": "products overflow or underflow",
    "ReduceL1": "long sums",
    "ReduceL2": "sum of squares overflows",
    "ReduceSumSquare": "sum of squares overflows",
    "ReduceLogSum": "long sums, then log",
    "ReduceLogSumExp": "exp of large values",
    "CumSum": "running sums grow without bound",
    "CumProd": "running products overflow",
    "Softplus": "exp inside; overflows for large inputs",
    "SoftmaxCrossEntropyLoss": "loss: softmax and log",
    "NegativeLogLikelihoodLoss": "loss reduction",
    "Sin": "large arguments (positions x frequencies) lose all precision",
    "Cos": "large arguments (positions x frequencies) lose all precision",
    "Tan": "poles; large outputs",
    "Asin": "steep near +-1",
    "Acos": "steep near +-1",
    "Sinh": "exponential growth",
    "Cosh": "exponential growth",
    "Atanh": "poles at +-1",
    "Acosh": "steep near 1",
    "Range": "float ranges past 2048 are not representable in fp16",
    "Det": "products of many terms",
    "DFT": "long sums",
    "STFT": "long sums",
    "LpPool": "sum of p-th powers",
    "GlobalLpPool": "sum of p-th powers",
}

DEFAULT_FOLLOW: dict[str, str] = {
    op: why
    for why, ops in {
        "data movement: exact in any type": (
            "Identity Reshape Transpose Squeeze Unsqueeze Flatten Concat Split Slice Gather "
            "GatherElements GatherND Scatter ScatterElements ScatterND TensorScatter Expand Tile Pad "
            "CenterCropPad Compress Where Trilu ReverseSequence DepthToSpace SpaceToDepth Col2Im "
            "Dropout OneHot Unique NonZero Shape Size CastLike ConcatFromSequence SplitToSequence"
        ),
        "resampling: interpolates neighbours, no range growth": (
            "Resize Upsample GridSample AffineGrid RoiAlign MaxRoiPool MaxUnpool"
        ),
        "pooling: max or local average, no range growth": "MaxPool AveragePool GlobalAveragePool GlobalMaxPool",
        "normalizes with its mean and variance in float32 whatever the data's type (stash_type 1, the default; "
        "stash_type 0 keeps it fp32)": "LayerNormalization",
        "cheap element-wise arithmetic": "Add Sub Mul Div Neg Abs Max Min Sum Mean Clip Sign Floor Ceil Round Mod Sqrt",
        "bounded or gently growing activation": (
            "Sigmoid Tanh HardSigmoid HardSwish LeakyRelu Elu Selu Celu Gelu Erf Mish Swish Softsign "
            "ThresholdedRelu Shrink SwiGLU Atan Asinh Hardmax RotaryEmbedding"
        ),
        "selection / comparison: no arithmetic": (
            "ReduceMax ReduceMin ArgMax ArgMin TopK Equal Less Greater LessOrEqual GreaterOrEqual IsNaN IsInf"
        ),
    }.items()
    for op in ops.split()
}

# --------------------------------------------------------------------------
# mindspore profile: the seed's lists, op for op
# --------------------------------------------------------------------------

MINDSPORE_WHITE: dict[str, str] = {
    "Conv": "nn.Conv1d/2d/3d, ops.Conv2D/Conv3D",
    "ConvTranspose": "nn.Conv1d/2d/3dTranspose, ops.Conv2D/3DTranspose, ops.Conv2DBackpropInput",
    "Gemm": "nn.Dense",
    "MatMul": "ops.MatMul, ops.BatchMatMul (and nn.Dense when exported as MatMul+Add)",
    "LSTM": "nn.LSTMCell",
    "GRU": "nn.GRUCell",
    "RNN": "nn.RNNCell",
    "PRelu": "ops.PReLU",
    "Relu": "ops.ReLU",
}
# ops.Ger (outer product) has no ONNX op: it exports as Mul or MatMul of reshaped vectors.

MINDSPORE_BLACK: dict[str, str] = {
    "BatchNormalization": "nn.BatchNorm1d/2d/3d",
    "LayerNormalization": "nn.LayerNorm",
}

# --------------------------------------------------------------------------
# paddle profile: python/paddle/amp/amp_lists.py, op for op
# --------------------------------------------------------------------------

PADDLE_FP16_WHITE: dict[str, str] = {
    "Conv": "conv2d",
    "Einsum": "einsum",
    "MatMul": "matmul, matmul_v2, mul",
    "Gemm": "fused_gemm_epilogue, mul",
    "MaxPool": "max_pool2d_with_index",
    "Attention": "fused_attention",
}
# fake_quantize_dequantize_* are quantized ops (never touched here);
# fused_feedforward has no single ONNX op.

PADDLE_BF16_WHITE: dict[str, str] = {
    "Conv": "conv2d",
    "Einsum": "einsum",
    "MatMul": "matmul_v2",
}

PADDLE_FP16_BLACK: dict[str, str] = {
    "Tan": "tan",
    "Acos": "acos",
    "Asin": "asin",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Atanh": "atanh",
    "Exp": "exp",
    "Log": "log",
    "Reciprocal": "reciprocal",
    "Pow": "pow",
    "ReduceSum": "reduce_sum",
    "ReduceMean": "mean, reduce_mean",
    "ReduceProd": "reduce_prod",
    "CumProd": "cumprod",
    "CumSum": "cumsum",
    "ReduceL1": "pnorm",
    "ReduceL2": "pnorm, frobenius_norm",
    "GroupNormalization": "group_norm",
    "LayerNormalization": "layer_norm",
    "Softmax": "softmax",
    "Softplus": "softplus",
    "LogSoftmax": "log_softmax",
    "SoftmaxCrossEntropyLoss": "softmax_with_cross_entropy, c_softmax_with_cross_entropy, cross_entropy",
    "NegativeLogLikelihoodLoss": "nll_loss, cross_entropy2",
}
# tanh_shrink, cos_sim, erfinv, expm1, log10, log2, rsqrt, square, dist, renorm,
# softmin and the remaining losses have no single ONNX op.

PADDLE_EXTRA_BLACK: dict[str, str] = {
    "Resize": "linear/nearest/bilinear/bicubic/trilinear_interp_v2",
    "Upsample": "*_interp_v2 (pre-opset-10 spelling)",
    "Gather": "lookup_table, lookup_table_v2 (embedding lookups)",
    "Scatter": "scatter",
    "ScatterElements": "scatter",
    "ScatterND": "scatter",
}

BATCHNORM = "BatchNormalization"

# --------------------------------------------------------------------------
# onnxruntime's fused ops (com.microsoft, and SimplifiedLayerNormalization)
# --------------------------------------------------------------------------
# What onnxruntime's transformer optimizer fuses a graph into. Their input
# slots that must stay float32 or integer come from onnxruntime's schemas
# (amp_convert.ortschema), not from here. Each op also names the standard op
# it stands for: the mindspore and paddle profiles give it that op's kind.

MS = "com.microsoft::"


def _ms(names: str) -> list[str]:
    """com.microsoft keys of space-separated op types."""
    return [MS + op for op in names.split()]


ORT_FUSED: dict[str, tuple[str, str, str]] = {
    # key: (kind in the default profile, the standard op it fuses, why)
    **{
        key: ("white", "MatMul", "fused attention: GEMM-bound; onnxruntime's kernels keep the softmax in fp32")
        for key in _ms(
            "Attention MultiHeadAttention GroupQueryAttention PackedAttention PackedMultiHeadAttention "
            "DecoderMaskedMultiHeadAttention DecoderMaskedSelfAttention DecoderAttention LongformerAttention "
            "SparseAttention PagedAttention"
        )
    },
    MS + "FusedMatMul": ("white", "MatMul", "MatMul with transposes and a scale folded in: GEMM-bound"),
    MS + "TransposeMatMul": ("white", "MatMul", "MatMul with transposes folded in: GEMM-bound"),
    MS + "FusedGemm": ("white", "Gemm", "Gemm with its activation: GEMM-bound"),
    MS + "GemmFastGelu": ("white", "Gemm", "Gemm with a tanh-approximated Gelu: GEMM-bound, bounded activation"),
    MS + "FusedConv": ("white", "Conv", "Conv with its activation: GEMM-bound"),
    **{
        key: (
            "follow",
            "LayerNormalization",
            "onnxruntime's kernel keeps its mean and variance in fp32 (type U), whatever the data's type",
        )
        for key in (
            MS + "SkipLayerNormalization",
            MS + "SkipSimplifiedLayerNormalization",
            "SimplifiedLayerNormalization",
            MS + "EmbedLayerNormalization",
        )
    },
    MS + "SkipGroupNorm": ("follow", "GroupNormalization", "onnxruntime's kernel keeps its statistics in fp32"),
    MS + "GroupNorm": ("follow", "GroupNormalization", "onnxruntime's kernel keeps its statistics in fp32"),
    **{
        key: ("follow", "Gelu", "bounded activation (with its bias add fused in)")
        for key in _ms("FastGelu BiasGelu Gelu QuickGelu BiasSplitGelu")
    },
    MS + "BiasAdd": ("follow", "Add", "cheap element-wise arithmetic"),
    MS + "RotaryEmbedding": ("follow", "RotaryEmbedding", "rotates pairs of values by cos/sin tables: no range growth"),
    MS + "GemmaRotaryEmbedding": ("follow", "RotaryEmbedding", "rotates pairs of values by cos/sin tables: no range growth"),
    MS + "BiasSoftmax": ("black", "Softmax", "softmax with its bias add: exp of large logits overflows"),
}

# onnxruntime's quantized ops: integer or block-quantized weights, never touched.
ORT_QUANTIZED_OPS = frozenset(
    _ms(
        "MatMulNBits MatMulNBitsMlp MatMulNBitsQkv MatMulBnb4 MatMulFpQ4 MatMulBlockQuantizedFp4Weight "
        "MatMulBlockQuantizedFp8Weight GemmFloat8 DynamicQuantizeMatMul DynamicQuantizeLSTM MatMulIntegerToFloat "
        "MatMulInteger16 MulInteger ReduceSumInteger QAttention QEmbedLayerNormalization QGemm QMoE QLinearAdd "
        "QLinearAveragePool QLinearConcat QLinearConv QLinearGlobalAveragePool QLinearLeakyRelu QLinearMul "
        "QLinearReduceMean QLinearSigmoid QLinearSoftmax QLinearWhere QOrderedAttention QOrderedGelu "
        "QOrderedLayerNormalization QOrderedLongformerAttention QOrderedMatMul QuantizeLinear DequantizeLinear "
        "QuantizeWithOrder DequantizeWithOrder QuantizeBFP DequantizeBFP GatherBlockQuantized"
    )
)


def _with_fused_ops(profile: str, white: dict[str, str], black: dict[str, str], follow: dict[str, str]) -> None:
    """Add onnxruntime's fused ops to a built-in profile's lists: the default
    profile's own kinds; the seeds' profiles give each the kind they give
    the standard op it fuses (unlisted where they list that op nowhere)."""
    tables = {"white": white, "black": black, "follow": follow}
    for key, (kind, standard, why) in ORT_FUSED.items():
        if profile == "default":
            tables[kind][key] = why
            continue
        for table in (black, white, follow):
            if standard in table:
                table[key] = f"as {standard}: {why}"
                break


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


def builtin_lists(profile: str, level: str, dtype: str) -> tuple[dict[str, str], dict[str, str], dict[str, str], bool]:
    """(white, black, follow, unlisted_follow) of a built-in profile."""
    if profile == "default":
        white, black, follow, unlisted_follow = dict(DEFAULT_WHITE), dict(DEFAULT_BLACK), dict(DEFAULT_FOLLOW), False
    elif profile == "mindspore":
        white, black, follow, unlisted_follow = dict(MINDSPORE_WHITE), dict(MINDSPORE_BLACK), dict(DEFAULT_FOLLOW), False
    elif profile == "paddle":
        white = dict(PADDLE_BF16_WHITE if dtype == "bf16" else PADDLE_FP16_WHITE)
        # Paddle: O1 black = FP16_BLACK_LIST | EXTRA_BLACK_LIST; O2 black = EXTRA_BLACK_LIST;
        # its bf16 black list is empty apart from the extras.
        black = dict(PADDLE_EXTRA_BLACK)
        if level == "O1" and dtype == "fp16":
            black.update(PADDLE_FP16_BLACK)
        follow, unlisted_follow = {}, True
    else:
        raise ValueError(f"unknown list profile {profile!r}: use one of {', '.join(PROFILES)}")
    _with_fused_ops(profile, white, black, follow)
    return white, black, follow, unlisted_follow


def resolve_lists(
    profile: str = "default",
    level: str = "O2",
    dtype: str = "fp16",
    *,
    white_list: Iterable[str] = (),
    black_list: Iterable[str] = (),
    only_white_list: Iterable[str] | None = None,
    only_black_list: Iterable[str] | None = None,
    keep_batchnorm_fp32: bool | None = None,
) -> OpLists:
    """Apply level, dtype and user lists to a profile.

    ``white_list`` / ``black_list`` add to the built-in lists with Paddle's
    ``custom_white_list`` / ``custom_black_list`` semantics (an op moves from
    the other list); ``only_white_list`` / ``only_black_list`` replace them
    (MindSpore's ``custom_mixed_precision``). Op names must already be
    validated (see :func:`amp_convert.schema.validate_op_names`).
    """
    white_add, black_add = set(white_list), set(black_list)
    both = sorted(white_add & black_add)
    if both:
        raise ValueError(f"op type(s) in both the white and the black list: {', '.join(both)}")
    white, black, follow, unlisted_follow = builtin_lists(profile, level, dtype)
    notes: list[str] = []
    if only_white_list is not None:
        white = {op: "--only-white-list" for op in only_white_list}
        black = {}
    if only_black_list is not None:
        black = {op: "--only-black-list" for op in only_black_list}
    if level == "O3":
        # O3 runs everything low: no built-in black list, only the explicit switches below.
        black = {}
    # keep_batchnorm_fp32: MindSpore's build_train_network switch (O2: True, O3: False); an
    # --only-black-list replaces the list BatchNormalization is on by default, not an explicit switch.
    keep_bn = keep_batchnorm_fp32 if keep_batchnorm_fp32 is not None else (level == "O2" and only_black_list is None)
    if keep_bn and level in ("O2", "O3"):
        black.setdefault(BATCHNORM, "keep_batchnorm_fp32")
    elif keep_batchnorm_fp32 is False and BATCHNORM in black:
        del black[BATCHNORM]
        notes.append("BatchNormalization removed from the black list (--no-keep-batchnorm-fp32)")
    for op in sorted(white_add):
        white[op] = "--white-list"
        if black.pop(op, None) is not None:
            notes.append(f"{op} moved from the black to the white list")
    for op in sorted(black_add):
        black[op] = "--black-list"
        if white.pop(op, None) is not None:
            notes.append(f"{op} moved from the white to the black list")
    for op in list(follow):
        if op in white or op in black:
            del follow[op]
    return OpLists(profile, white, black, follow, unlisted_follow, tuple(notes))
