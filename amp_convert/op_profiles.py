"""The built-in operator list profiles, and the lists in force for a conversion.

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

The op-type data the lists do not govern (quantized ops, control flow,
sources, ...) is in lists.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from .lists import BATCHNORM, MS, PROFILES, OpLists, ms_ops

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


# --------------------------------------------------------------------------
# onnxruntime's fused ops (com.microsoft, and SimplifiedLayerNormalization)
# --------------------------------------------------------------------------
# What onnxruntime's transformer optimizer fuses a graph into. Their input
# slots that must stay float32 or integer come from onnxruntime's schemas
# (amp_convert.ortschema), not from here. Each op also names the standard op
# it stands for: the mindspore and paddle profiles give it that op's kind.

ORT_FUSED: dict[str, tuple[str, str, str]] = {
    # key: (kind in the default profile, the standard op it fuses, why)
    **{
        key: ("white", "MatMul", "fused attention: GEMM-bound; onnxruntime's kernels keep the softmax in fp32")
        for key in ms_ops(
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
        for key in ms_ops("FastGelu BiasGelu Gelu QuickGelu BiasSplitGelu")
    },
    MS + "BiasAdd": ("follow", "Add", "cheap element-wise arithmetic"),
    MS + "RotaryEmbedding": ("follow", "RotaryEmbedding", "rotates pairs of values by cos/sin tables: no range growth"),
    MS + "GemmaRotaryEmbedding": ("follow", "RotaryEmbedding", "rotates pairs of values by cos/sin tables: no range growth"),
    MS + "BiasSoftmax": ("black", "Softmax", "softmax with its bias add: exp of large logits overflows"),
}


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
        white = {op: "`only_white_list`" for op in only_white_list}
        black = {}
    if only_black_list is not None:
        black = {op: "`only_black_list`" for op in only_black_list}
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
        notes.append("BatchNormalization removed from the black list (`keep_batchnorm_fp32` false)")
    for op in sorted(white_add):
        white[op] = "`white_list`"
        if black.pop(op, None) is not None:
            notes.append(f"{op} moved from the black to the white list")
    for op in sorted(black_add):
        black[op] = "`black_list`"
        if white.pop(op, None) is not None:
            notes.append(f"{op} moved from the white to the black list")
    for op in list(follow):
        if op in white or op in black:
            del follow[op]
    return OpLists(profile, white, black, follow, unlisted_follow, tuple(notes))
