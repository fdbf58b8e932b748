"""What a model's outputs hold, as validation compares them: tensors, maps,
sequences and optionals of them, read from their declared types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .typeinfo import held_type


def value_kind(type_proto: onnx.TypeProto) -> str:
    """What a value of this type is, as validation compares it: tensor
    (sparse ones compare as dense), map, seq(...) or optional(...) of one
    ("" where it is not declared, to the depth it is)."""
    which = type_proto.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type", "map_type"):
        return "map" if which == "map_type" else "tensor"
    if which not in ("sequence_type", "optional_type"):
        return ""
    held = value_kind(getattr(type_proto, which).elem_type)
    return held and f"{'seq' if which == 'sequence_type' else 'optional'}({held})"


def holds_sequence(type_proto: onnx.TypeProto) -> bool:
    """Whether a value of this type is a sequence, or an optional one."""
    if type_proto.WhichOneof("value") == "optional_type":
        type_proto = type_proto.optional_type.elem_type
    return type_proto.WhichOneof("value") == "sequence_type"


def map_value_dtype(type_proto: onnx.TypeProto) -> np.dtype | None:
    """The declared type of the values of the maps a value of this type
    holds (a map, or a sequence or optional of them); None where it holds
    none or does not say."""
    type_proto = held_type(type_proto)
    if type_proto.WhichOneof("value") != "map_type":
        return None
    elem = type_proto.map_type.value_type.tensor_type.elem_type
    return helper.tensor_dtype_to_np_dtype(elem) if elem and elem != TensorProto.STRING else None
