"""What a model's integer inputs are for, read from the graph: the values generated inputs take.

Random integers in [0, 2) are meaningless for most integer inputs of the
models people convert: a random 0/1 attention mask masks whole rows, and
token ids should range over the embedding table. The role of an integer
(or bool) graph input comes from what it feeds, following it through ops
that carry its values on (Cast, Unsqueeze, Reshape, Expand, Sub, Mul, ...,
and a Gather, GatherElements or GatherND of it, which picks some of them:
transformers' padding masks are gathered by position on their way to the
scores):

* **mask** (all ones): it reaches an attention op's mask input (mask_index,
  key_padding_mask, attention_bias, ...; onnxruntime's attention family and
  ONNX's Attention) or EmbedLayerNormalization's mask;
* **positions** (0, 1, 2, ... along the last axis, within the table they
  index): it reaches RotaryEmbedding's or EmbedLayerNormalization's
  position_ids, or it indexes a table (below) and its name says positions
  ("position_ids", "pos"); renamed, such an input is still drawn within
  the table;
* **index** (integers in [0, rows)): it is the indices of a Gather whose
  data is a constant table (an embedding), or EmbedLayerNormalization's
  input_ids / segment_ids: rows is the smallest such table's size;
* **mask**, also: summed (ReduceSum) on its way to GroupQueryAttention's
  seqlens_k or total_sequence_length: the lengths a padding mask makes
  (a random 0/1 mask would cut every sequence short);
* **mask**, again: it reaches a Softmax (an additive mask added to the
  scores) and none of the rules above holds;
* **branch** (one value per sample, in turn): it picks the branch an If
  runs, as its condition or compared with a constant (Equal, Greater, Less,
  ... through Cast, Reshape, Gather ...) into its condition: the values
  take each side of each comparison (Silero VAD's ``sr == 16000``: 16000,
  then 16001), so the samples run every branch, not only the one that
  random 0s and 1s pick.

The first rule that holds wins, in that order. An input none of them holds
for keeps the default range.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .constant_stats import constant_values
from .graph import graph_initializers
from .schema import is_default_domain

# Ops that carry an input's values on to their outputs (possibly changed):
# what they feed is what the input feeds.
_CARRIERS = frozenset(
    {
        *("Cast", "CastLike", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose"),
        *("Slice", "Concat", "Tile", "Sub", "Add", "Mul", "Div", "Neg", "Not", "Equal", "Less", "Greater"),
        *("And", "Or", "Where", "Min", "Max", "Clip"),
    }
)
# Ops that sum what they carry on: a mask summed into sequence lengths.
_SUMMERS = frozenset({"ReduceSum"})
_CARRYING = _CARRIERS | _SUMMERS
# Ops that carry on the values of their data input (slot 0) only.
_PICKERS = frozenset({"Gather", "GatherElements", "GatherND"})
# (domain, op) -> {input slot: role}, for the ops whose slots say what they read.
_SLOTS: dict[tuple[str, str], dict[int, str]] = {
    ("com.microsoft", "Attention"): {3: "mask", 5: "mask"},
    ("com.microsoft", "MultiHeadAttention"): {4: "mask", 5: "mask"},
    ("com.microsoft", "PackedAttention"): {5: "mask"},
    ("com.microsoft", "PackedMultiHeadAttention"): {6: "mask"},
    ("com.microsoft", "DecoderMaskedMultiHeadAttention"): {3: "mask", 4: "mask"},
    ("com.microsoft", "DecoderMaskedSelfAttention"): {3: "mask", 5: "mask"},
    ("com.microsoft", "DecoderAttention"): {5: "mask"},
    ("com.microsoft", "LongformerAttention"): {3: "mask"},
    ("com.microsoft", "EmbedLayerNormalization"): {0: "index", 1: "index", 7: "mask", 8: "positions"},
    ("com.microsoft", "RotaryEmbedding"): {1: "positions"},
    ("com.microsoft", "GroupQueryAttention"): {5: "lengths", 6: "lengths", 9: "positions"},
    ("", "Attention"): {3: "mask"},
    ("", "Softmax"): {0: "softmax"},
}
# The table an index or positions slot ranges over: (domain, op) -> {slot: table slot}.
_TABLES = {
    ("com.microsoft", "EmbedLayerNormalization"): {0: 2, 1: 4, 8: 3},
    ("com.microsoft", "RotaryEmbedding"): {1: 2},  # (cos_cache: one row per position)
}
# Ops that pass an input's values on as they are (some of them: Gather, Slice), to a comparison further on.
_SAME_VALUES = frozenset({"Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Slice", *_PICKERS})
# Ops that pass a condition on to an If (negated or combined with others).
_CONDITIONS = frozenset({"Identity", "Cast", "Not", "And", "Or", "Xor", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
# A comparison read with the constant on the left is its mirror read with it on the right.
_MIRRORED = {
    **{"Equal": "Equal", "Greater": "Less", "Less": "Greater"},
    **{"GreaterOrEqual": "LessOrEqual", "LessOrEqual": "GreaterOrEqual"},
}
_POSITION_NAME = re.compile(r"(^|[^a-z])pos(ition)?s?([^a-z]|ids|$)", re.IGNORECASE)


@dataclass(frozen=True)
class InputRole:
    """What an input is for: ``kind`` is "mask", "positions", "index" or
    "branch"; ``rows`` the table size an index ranges over (None for the
    others); ``values`` a branch input's values, one per sample in turn;
    ``why`` the node that shows it."""

    kind: str
    why: str
    rows: int | None = None
    values: tuple[int, ...] = ()

    @property
    def token(self) -> bool:
        """Whether the input holds tokens (ids, a mask, positions) along a sequence; a branch input does not."""
        return self.kind != "branch"


def input_roles(model: onnx.ModelProto) -> dict[str, InputRole]:
    """The role of each integer or bool input of ``model``'s main graph that
    one of the module's rules gives one (see the module's docstring)."""
    graph = model.graph
    held = {**graph_initializers(graph), **constant_values(graph.node, [n.op_type for n in graph.node])}
    tables = {name: tuple(t.dims) for name, t in held.items()}  # (a Constant node's value is a table too)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name:
                readers[name].append((node, k))
    integer = {onnx.TensorProto.BOOL, *(t for t in range(1, 17) if onnx.helper.tensor_dtype_to_np_dtype(t).kind in "iu")}
    found = {}
    for v in graph.input:
        if v.name in tables or v.type.tensor_type.elem_type not in integer:
            continue
        np_type = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        role = _role(v.name, readers, tables) or _branch_role(v.name, readers, held, np_type)
        if role is not None:
            found[v.name] = role
    return found


def _role(name: str, readers, tables: dict[str, tuple[int, ...]]) -> InputRole | None:
    """The role of the tensor ``name`` from what it reaches (see the module's docstring)."""
    reached: dict[str, InputRole] = {}
    seen, frontier = {name}, [(name, False)]
    while frontier:
        tensor, summed = frontier.pop()  # (summed: a ReduceSum is on the way)
        for node, k in readers.get(tensor, ()):
            label = _label(node)
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            slot_role = _SLOTS.get((domain, node.op_type), {}).get(k)
            table_slot = _TABLES.get((domain, node.op_type), {}).get(k)
            table = node.input[table_slot] if table_slot is not None and table_slot < len(node.input) else ""
            rows = (tables.get(table) or (None,))[0] if table else None
            if slot_role == "lengths":  # (summed, the mask's ones are the lengths; as given, no rule says what they are)
                if summed:
                    reached.setdefault("mask", InputRole("mask", f"summed into input {k} of {label} (sequence lengths)"))
            elif slot_role == "index":
                if rows:
                    _keep_smallest(reached, InputRole("index", f"indexes the rows of {table!r} ({label})", rows))
            elif slot_role is not None:
                reached.setdefault(slot_role, InputRole(slot_role, f"reaches input {k} of {label}", rows or None))
            elif node.op_type == "Gather" and domain == "" and k == 1 and node.input[0] in tables:
                dims = tables[node.input[0]]
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    why = f"indexes the rows of {node.input[0]!r} ({label})"
                    _keep_smallest(reached, InputRole("index", why, dims[axis]))
            elif domain == "" and (node.op_type in _CARRYING or (node.op_type in _PICKERS and k == 0)):
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        frontier.append((out, summed or node.op_type in _SUMMERS))
    if "mask" in reached or "positions" in reached:
        return reached.get("mask") or reached["positions"]
    index = reached.get("index")
    if index is not None:
        if _POSITION_NAME.search(name):
            return InputRole("positions", f"its name says positions, and it {index.why}", index.rows)
        return index
    softmax = reached.get("softmax")
    return None if softmax is None else InputRole("mask", softmax.why)


def _keep_smallest(reached: dict[str, InputRole], role: InputRole) -> None:
    """Keep the index role with the fewest rows: every table it indexes must hold its values."""
    held = reached.get("index")
    if held is None or (role.rows or 0) < (held.rows or 0):
        reached["index"] = role


def _branch_role(name: str, readers, held: dict[str, onnx.TensorProto], dtype: np.dtype) -> InputRole | None:
    """The branch role of the input ``name`` (of ``dtype``), from the If
    conditions it decides (see the module's docstring)."""
    values: list[int] = []
    whys: list[str] = []
    for node, k in _reached(name, readers, lambda node, k: node.op_type in _SAME_VALUES and k == 0):
        op = node.op_type
        if op in _MIRRORED and len(node.input) == 2:
            constant = _single_value(held.get(node.input[1 - k]))
            sides = None if constant is None else _sides(_MIRRORED[op] if k else op, constant)
            branch = _condition_of(node.output[0], readers) if sides is not None else None
            if branch is None:
                continue
            whys.append(f"{op} with {constant:g} into the condition of {branch}")
        elif op == "If" and k == 0:
            sides = (1, 0)
            whys.append(f"the condition of {_label(node)}")
        else:
            continue
        values.extend(v for v in sides if v not in values and _fits(v, dtype))
    if len(values) < 2:
        return None
    return InputRole("branch", f"picks the branch an If runs ({'; '.join(whys)})", values=tuple(values))


def _reached(name: str, readers, passes: Callable[[onnx.NodeProto, int], bool]) -> Iterator[tuple[onnx.NodeProto, int]]:
    """The default-domain nodes (and their input slots) that read ``name``,
    or read what a node ``passes(node, slot)`` says passes it on does."""
    seen, frontier = {name}, [name]
    while frontier:
        for node, k in readers.get(frontier.pop(), ()):
            if not is_default_domain(node.domain):
                continue
            if passes(node, k):
                frontier.extend(out for out in node.output if out and out not in seen)
                seen.update(node.output)
            else:
                yield node, k


def _single_value(tensor: onnx.TensorProto | None) -> float | None:
    """The one value a constant holds (None: none, several, or not a number)."""
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    array = numpy_helper.to_array(tensor)
    if array.size != 1 or array.dtype.kind not in "biuf":
        return None
    value = float(array.reshape(-1)[0])
    return value if math.isfinite(value) else None


def _sides(op: str, c: float) -> tuple[int, ...] | None:
    """Integers on either side of ``x op c``: one that holds it, then one that does not."""
    low, high = math.floor(c), math.ceil(c)
    if op == "Equal":
        return (low, low + 1) if low == high else None
    return {
        "Greater": (low + 1, low),
        "GreaterOrEqual": (high, high - 1),
        "Less": (high - 1, high),
        "LessOrEqual": (low, low + 1),
    }[op]


def _condition_of(name: str, readers) -> str | None:
    """The If whose condition ``name`` reaches (through negations,
    conjunctions, casts and reshapes), labelled; None where none does."""
    reached = _reached(name, readers, lambda node, k: node.op_type in _CONDITIONS)
    return next((_label(node) for node, k in reached if node.op_type == "If" and k == 0), None)


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else node.op_type


def _fits(value: int, dtype: np.dtype) -> bool:
    if dtype == np.bool_:
        return value in (0, 1)
    info = np.iinfo(dtype)
    return info.min <= value <= info.max
