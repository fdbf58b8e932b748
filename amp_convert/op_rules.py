"""The planner's rules that depend on a node's op alone: the level and the
lists (rule 5), the schema's low slots (rule 6), and the states the forward
pass gives tensors and nodes. Pure functions, shared by the planner, the
auto search and the coverage count.
"""

from __future__ import annotations

import onnx

from .dtypes import FLOAT, LowDtype
from .graph import GraphContext, attribute_int
from .lists import CONVERTED_INPUTS, DTYPE_AGNOSTIC_INPUTS, SOURCE_OPS, OpLists
from .plan import Precision
from .schema import Signature, first_opset_admitting, is_default_domain, op_key
from .typeinfo import NOT_A_TENSOR

# Ops that read their float input for its shape alone (Shape, Size): they
# compute nothing in float32 or low, whatever version of it they read.
SHAPE_READERS = {op: frozenset(slots) for op, slots in DTYPE_AGNOSTIC_INPUTS.items() if op not in CONVERTED_INPUTS}

# Data precision of a tensor while planning.
LOW, F32, NEUTRAL = "low", "fp32", "neutral"
FIXED, FOLLOW, SOURCE = "fixed", "follow", "source"  # states of the forward pass (the last two provisional)
SEEN_LOW, SEEN_F32 = 1, 2  # which data states reach a node (bits)


def stash_in_data_type(op: str, node: onnx.NodeProto) -> bool:
    """A LayerNormalization whose statistics are computed in the data's type (stash_type not 1)."""
    return op == "LayerNormalization" and attribute_int(node, "stash_type", 1) != 1


def seen_bits(states: set) -> int:
    """The bits (SEEN_LOW, SEEN_F32) for the data states reaching a node."""
    return (SEEN_LOW if LOW in states else 0) | (SEEN_F32 if F32 in states else 0)


def output_state(neutral: bool, low: bool) -> str:
    """The data state of a float output: neutral while its node waits for its consumers, else low or fp32."""
    return NEUTRAL if neutral else LOW if low else F32


def float_slots(ctx: GraphContext, i: int) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(float32 input slots, float32 output slots, some tensor's type unknown)."""
    types = ctx.types
    unknown = False
    sequence = False  # a sequence, map or optional: its element type is not tracked
    ins = []
    for slot, name in enumerate(ctx.ins[i]):
        if name:
            t = types.get(name) or ctx.type_of(name)
            if t == FLOAT:
                ins.append(slot)
            elif t == 0:
                unknown = True
            elif t == NOT_A_TENSOR:
                sequence = True
    outs = []
    for slot, name in enumerate(ctx.outs[i]):
        if name:
            t = types.get(name, 0)
            if t == FLOAT:
                outs.append(slot)
            elif t == 0:
                unknown = True
            elif t == NOT_A_TENSOR:
                sequence = True
    # A float32 tensor going into or coming out of a sequence keeps its type:
    # the sequence on the other side would change type unseen.
    return tuple(ins), tuple(outs), unknown or (sequence and bool(ins or outs))


def list_rule(lists: OpLists, level: str, key: str) -> tuple:
    """Rule 5, the level and the lists: (precision, rule, reason, state) for
    an op (``key``: its name, ``domain::name`` outside the default domain)."""
    if key in lists.black:
        return Precision.FP32, "black-list", f"black list: {lists.black[key]}", FIXED
    if level == "O3":
        return Precision.LOW, "level", "O3 runs everything low", FIXED
    if key in lists.white:
        return Precision.LOW, "white-list", f"white list: {lists.white[key]}", FIXED
    if key in lists.follow or lists.unlisted_follow:
        why = lists.follow.get(key, "unlisted: follows its inputs")
        return Precision.FP32, "follow", f"follow: {why}", FOLLOW
    if level == "O1":
        return Precision.FP32, "level", "O1: not on the white list", FIXED
    return Precision.LOW, "level", "O2: not on the black list", FIXED


def fp32_by_lists(op: str, domain: str, lists: OpLists, level: str) -> bool:
    """Whether rule 5 keeps every node of this op fp32 at ``level``, whatever
    data reaches it (the black list; at O1, an op on no list): the auto search,
    falling back to ``level``, need not try such a node low again. (A source op
    is decided by its consumers before the lists are read.)"""
    default_domain = is_default_domain(domain)
    if default_domain and op in SOURCE_OPS:
        return False
    precision, _, _, state = list_rule(lists, level, op if default_domain else op_key(op, domain))
    return precision is Precision.FP32 and state == FIXED


def lowered_slots(
    op_type: str,
    domain: str,
    float_ins: tuple[int, ...],
    float_outs: tuple[int, ...],
    sig: Signature | None,
    low: LowDtype,
    opset: int = 0,
) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """Input and output slots that switch to ``low`` when the node runs low,
    or a reason why it cannot.

    Every type variable bound to a float32 tensor switches, if the schema
    admits the low dtype for it; a type variable that does not admit it
    keeps its inputs fp32 (Resize ``scales``), and stops the node if it binds
    an output. Ops without a schema (custom domains the user listed) switch
    all float32 tensors.
    """
    if sig is None:
        return float_ins, float_outs
    if op_type not in SOURCE_OPS:
        # An output whose type variable no float32 input binds is fixed by an
        # attribute (LayerNormalization's Mean/InvStdDev: stash_type): it keeps its type.
        bound = {sig.input_type(s) for s in float_ins}
        float_outs = tuple(s for s in float_outs if sig.output_type(s) not in sig.allowed or sig.output_type(s) in bound)
    for slot in float_outs:
        type_str = sig.output_type(slot) or ""
        if not sig.admits(type_str, low.onnx_type):
            reason = f"schema of {op_type} (opset {sig.since_version}) does not admit {low.name} for output {slot}"
            return reason + _opset_hint(op_type, domain, opset, low)
    low_inputs = tuple(s for s in float_ins if sig.admits(sig.input_type(s) or "", low.onnx_type))
    if not low_inputs and not float_outs:
        reason = f"schema of {op_type} (opset {sig.since_version}) admits no {low.name} input or output"
        return reason + _opset_hint(op_type, domain, opset, low)
    return low_inputs, float_outs


def admitting_opset(op_type: str, domain: str, opset: int, low: LowDtype) -> tuple[int, bool] | None:
    """The first opset after ``opset`` whose schema of the op admits ``low``,
    and whether onnxruntime loads a model at it (None: no such opset)."""
    newer = first_opset_admitting(op_type, domain, opset, low.onnx_type)
    if newer is None:
        return None
    from .ortversions import loads_opset

    return newer, loads_opset(newer)


def _opset_hint(op_type: str, domain: str, opset: int, low: LowDtype) -> str:
    """For a schema's refusal: the opset that admits ``low``, with the
    --target-opset that gets it only where onnxruntime loads that opset (past
    it, the refusal would move from the schema to the runtime)."""
    found = admitting_opset(op_type, domain, opset, low)
    if found is None:
        return ""
    newer, loads = found
    if loads:
        return f"; it does from opset {newer} (`target_opset` {newer})"
    import onnxruntime

    from .ortversions import newest_loaded_opset

    newest = newest_loaded_opset(newer)
    return f"; it does from opset {newer}, which onnxruntime {onnxruntime.__version__} does not load (it loads up to {newest})"
