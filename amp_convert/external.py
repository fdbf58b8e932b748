"""External data: tensors stored beside the model, read lazily and written
tensor by tensor.

A model loaded with ``load_model(path, lazy_external=True)`` keeps its
external tensors as references to the input's data file. A tensor the
converter lowers keeps that reference too: it is retyped, and its float32
bytes are converted chunk by chunk when the model is written (or when
something reads the tensor). The others are copied from the input's data
file to the output's in chunks. Neither the fp32 weights nor their
low-precision copy is ever held in memory whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import helper

from .graph import may_nest, node_subgraphs
from .lists import VALUE_ATTRIBUTE_OPS

PROTOBUF_LIMIT = 2**31 - 1  # a ModelProto cannot serialize past 2 GB
CHUNK = 64 << 20
ALIGN = 64  # offsets of tensors in the data file, for memory-mapped readers
INLINE_BELOW = 1024  # bytes: smaller tensors stay inside the .onnx file


# An external_data entry of a tensor retyped in memory whose file segment
# still holds the values in the type it names (an int, as text).
STORED_TYPE = "amp_convert.stored_type"
# Beside STORED_TYPE: the type the stored values are rounded through before
# they take the tensor's type (an emulation twin's float32 copy of a lowered
# weight: float32 -> float16 -> float32, never held in memory whole).
ROUNDED_TYPE = "amp_convert.rounded_type"


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def retype_external(tensor: onnx.TensorProto, elem_type: int) -> None:
    """Give an external tensor another (float) type without reading it: its
    values are converted wherever they are read or written."""
    if STORED_TYPE not in external_info(tensor):
        entry = tensor.external_data.add()
        entry.key, entry.value = STORED_TYPE, str(tensor.data_type)
    tensor.data_type = elem_type


def widen_external(tensor: onnx.TensorProto, elem_type: int) -> None:
    """Retype an external low-precision tensor to the float ``elem_type``
    without reading it, its values rounded to its current type first where
    they are still stored in another (a lowered fp32 weight): what
    :func:`read_array` and a written copy hold is then exactly the low
    values, widened."""
    if STORED_TYPE in external_info(tensor):
        entry = tensor.external_data.add()
        entry.key, entry.value = ROUNDED_TYPE, str(tensor.data_type)
        tensor.data_type = elem_type
    else:
        retype_external(tensor, elem_type)


def _rounding(info: dict[str, str]) -> np.dtype | None:
    return _np_dtype(int(info[ROUNDED_TYPE])) if ROUNDED_TYPE in info else None


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def element_count(tensor: onnx.TensorProto) -> int:
    """Number of values a tensor's shape holds."""
    count = 1
    for d in tensor.dims:
        count *= d
    return count


def _value_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor's values take in its (fixed-size) element type."""
    return element_count(tensor) * _np_dtype(tensor.data_type).itemsize


def read_array(tensor: onnx.TensorProto, base_dir: str | os.PathLike) -> np.ndarray:
    """The values of an external tensor, mapped from its file segment (read
    only), converted to the tensor's type if it was retyped."""
    info = external_info(tensor)
    stored = _np_dtype(int(info[STORED_TYPE])) if STORED_TYPE in info else _np_dtype(tensor.data_type)
    count = element_count(tensor)
    if count == 0:
        array = np.empty(0, stored)
    else:
        offset = int(info.get("offset", 0) or 0)
        array = np.memmap(Path(base_dir) / info["location"], dtype=stored, mode="r", offset=offset, shape=(count,))
    if STORED_TYPE in info:
        rounding = _rounding(info)
        array = (array if rounding is None else array.astype(rounding)).astype(_np_dtype(tensor.data_type))
    return array.reshape(tuple(tensor.dims))


def load_external_values(model: onnx.ModelProto, base_dir: str | os.PathLike) -> None:
    """Read every external tensor of ``model`` (see :func:`all_tensors`) into
    it, the retyped ones converted (see :func:`retype_external`). onnx's
    ``load_external_data_for_model`` leaves the values and indices of
    sparse tensors in their files."""
    for tensor in all_tensors(model.graph):
        if not is_external(tensor):
            continue
        if STORED_TYPE in external_info(tensor):
            data = np.ascontiguousarray(read_array(tensor, base_dir)).view(np.uint8).tobytes()
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = data
        else:
            inline_external(tensor, base_dir)


def inline_external(tensor: onnx.TensorProto, base_dir: str | os.PathLike) -> None:
    """Read an external tensor's data (from ``base_dir``) into it."""
    from onnx.external_data_helper import load_external_data_for_tensor

    load_external_data_for_tensor(tensor, str(base_dir))
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def all_initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers of a graph and of all its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        if may_nest(node):
            for _, sub in node_subgraphs(node):
                yield from all_initializers(sub)


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers, the values and indices of sparse ones, and tensor
    attributes (Constant values, sparse ones included), subgraphs included:
    every tensor that can hold external data."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        if may_nest(node) or node.op_type in VALUE_ATTRIBUTE_OPS:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from all_tensors(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        yield from all_tensors(g)
                else:
                    yield from attribute_tensors(a)


def attribute_tensors(a: onnx.AttributeProto) -> Iterator[onnx.TensorProto]:
    """The tensors an attribute holds (a sparse one's values and indices too)."""
    if a.type == onnx.AttributeProto.TENSOR:
        yield a.t
    elif a.type == onnx.AttributeProto.TENSORS:
        yield from a.tensors
    elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
        yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
    elif a.type == onnx.AttributeProto.SPARSE_TENSORS:
        for sparse in a.sparse_tensors:
            yield from (sparse.values, sparse.indices)


@dataclass(frozen=True)
class Payload:
    """What a model's tensors weigh and where they live, from one walk."""

    external: int  # bytes of tensor data in external files
    files: frozenset[str]  # the external data files (locations)
    total: int  # size of the model saved as one file
    serialized: bytes | None = field(default=None, repr=False)  # that file's bytes, when measuring made them

    @property
    def has_external(self) -> bool:
        return bool(self.files)


def payload(model: onnx.ModelProto, *, may_be_external: bool = True) -> Payload:
    """Measure ``model``: its tensors' bytes (external ones included) and the
    size of it saved as one file. Measuring a protobuf message serializes
    it, so a model whose tensors alone pass a gigabyte is not measured: its
    tensor bytes are the total (a lower bound, which is all a 2 GB test needs).
    ``may_be_external=False``: the caller knows no tensor is external; the
    model is serialized (no walk over its tensors), and the bytes kept for
    writing it."""
    if not may_be_external:
        try:
            serialized = model.SerializeToString()
            return Payload(0, frozenset(), len(serialized), serialized)
        except (ValueError, EncodeError):  # over protobuf's 2 GiB: measured below
            pass
    inline = external = 0
    files: set[str] = set()
    for t in all_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = external_info(t)
            external += _written_length(t, info)
            files.add(info.get("location", ""))
        else:
            inline += len(t.raw_data)
    total = inline + external if inline + external > 1 << 30 else model.ByteSize() + external
    return Payload(external, frozenset(files), total)


def has_external(model: onnx.ModelProto) -> bool:
    return any(is_external(t) for t in all_tensors(model.graph))


def payload_bytes(model: onnx.ModelProto) -> int:
    """Size of the model saved as one file (see :func:`payload`)."""
    return payload(model).total


def write_with_external_data(
    model: onnx.ModelProto, model_path: Path, data_name: str, source_dir: Path | None, data_path: Path | None = None
) -> None:
    """Write ``model`` to ``model_path`` and its large tensors to ``data_name``
    (beside it, or at ``data_path``), streaming tensors that still live in
    the input's data files (initializers and tensor attributes alike).
    ``model`` is modified: its large initializers become references to the
    new data file; tensor attributes stay inline unless they were external."""
    data_path = data_path or model_path.with_name(data_name)
    kept = list(all_initializers(model.graph))  # (alive, so their ids stay theirs)
    initializers = {id(t) for t in kept}
    moved = 0
    with open(data_path, "wb") as out:
        for tensor in all_tensors(model.graph):
            if is_external(tensor) and element_count(tensor) == 0:  # (a zero-length segment at the end of a file does not load)
                del tensor.external_data[:]
                tensor.data_location = onnx.TensorProto.DEFAULT
                tensor.raw_data = b""
                continue
            if is_external(tensor):
                if source_dir is None:
                    raise ValueError(f"tensor {tensor.name!r} refers to external data but no source folder is known")
                info = external_info(tensor)
                source, start = Path(source_dir) / info["location"], int(info.get("offset", 0) or 0)
                offset = _pad(out)
                if STORED_TYPE in info:
                    stored = _np_dtype(int(info[STORED_TYPE]))
                    wanted, rounding = _np_dtype(tensor.data_type), _rounding(info)
                    length = _convert_segment(source, start, element_count(tensor), stored, wanted, out, rounding)
                else:
                    length = _copy_segment(source, start, _data_length(tensor, info), out)
            elif id(tensor) in initializers and _large(tensor):
                data = tensor.raw_data
                if len(data) < INLINE_BELOW:
                    continue
                offset = _pad(out)
                out.write(data)
                length = len(data)
                tensor.ClearField("raw_data")
            else:
                continue
            _point_to(tensor, data_name, offset, length)
            moved += 1
        out.flush()
        os.fsync(out.fileno())
    if not moved:  # every tensor is small enough to stay inline
        data_path.unlink()
    with open(model_path, "wb") as f:
        f.write(model.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor's values take where they are held: an external one's
    data length, an inline raw one's values in its type, else its serialized
    size (typed fields). Neither serializes nor copies a raw weight."""
    if is_external(tensor):
        return _data_length(tensor, external_info(tensor))
    if tensor.HasField("raw_data"):
        return _value_bytes(tensor)
    return tensor.ByteSize()


def _large(tensor: onnx.TensorProto) -> bool:
    """Whether an inline tensor reaches INLINE_BELOW bytes."""
    return tensor_bytes(tensor) >= INLINE_BELOW


def _written_length(tensor: onnx.TensorProto, info: dict[str, str]) -> int:
    """Bytes the tensor takes once written: converted ones in their new type."""
    return _value_bytes(tensor) if STORED_TYPE in info else _data_length(tensor, info)


def _data_length(tensor: onnx.TensorProto, info: dict[str, str]) -> int:
    """Bytes of an external tensor: its ``length`` entry, which is optional;
    else what its shape and type hold."""
    return int(info["length"]) if info.get("length") else _value_bytes(tensor)


def _pad(out) -> int:
    offset = out.tell()
    if offset % ALIGN:
        out.write(b"\0" * (ALIGN - offset % ALIGN))
        offset = out.tell()
    return offset


def _copy_segment(source: Path, offset: int, length: int, out) -> int:
    with open(source, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                raise ValueError(f"{source}: shorter than the tensor it should hold")
            out.write(chunk)
            left -= len(chunk)
    return length


def _convert_segment(
    source: Path, offset: int, count: int, stored: np.dtype, wanted: np.dtype, out, rounding: np.dtype | None = None
) -> int:
    """Copy ``count`` values from ``source``, converting them from ``stored``
    to ``wanted`` (through ``rounding`` first, if given), one chunk at a
    time through reused buffers."""
    per_chunk = max(min(CHUNK // stored.itemsize, count), 1)
    values, converted = np.empty(per_chunk, stored), np.empty(per_chunk, wanted)
    rounded = np.empty(per_chunk, rounding) if rounding is not None else None
    raw = values.view(np.uint8)
    with open(source, "rb") as f:
        f.seek(offset)
        left = count
        while left:
            n = min(per_chunk, left)
            if f.readinto(raw[: n * stored.itemsize]) != n * stored.itemsize:
                raise ValueError(f"{source}: shorter than the tensor it should hold")
            if rounded is None:
                converted[:n] = values[:n]
            else:
                rounded[:n] = values[:n]
                converted[:n] = rounded[:n]
            out.write(converted[:n].view(np.uint8))
            left -= n
    return count * wanted.itemsize


def _point_to(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
