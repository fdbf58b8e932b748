"""Loading: read an ONNX file and refuse, with one clear line, anything that
is not a model the converter can work on.

Every problem with the input is an :class:`AmpError` (exit code 2): a path
that is not a file, bytes that are not an ONNX model (with a guess at what
they are), versions the converter does not handle, a model that fails the
ONNX checker, external data that is missing, too short, outside the
model's folder or not openable as written, names that are not UTF-8.
Messages are one line of bounded length. Nothing here writes anything.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx.defs
import onnx.shape_inference

from .calls import Call, Subgraph, local_functions, reached_calls
from .domains import declare_domains
from .errors import InputError
from .external import all_tensors, attribute_tensors, element_count, external_info, inline_external
from .graph import NodeLabels
from .ortschema import check_with_extras
from .schema import model_opsets

MIN_IR_VERSION = 3
MIN_OPSET = 7
MAX_DETAIL = 240  # characters of a library's message quoted in ours

_REEXPORT = "re-export or repair the model"

# Identity of every file a model was read from in this process (the model
# files and their external data): device, inode, and size and mtime, so that
# a new file reusing a freed inode is not mistaken for an input. saving.py
# refuses to write over them: no output path (-o, --plan-json, reports),
# however spelled (symlink, hard link, ``a/../b``), destroys an input.
_INPUT_FILES: set[tuple[int, int, int, int]] = set()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember_input(path: Path) -> None:
    with contextlib.suppress(OSError):
        _INPUT_FILES.add(_identity(path.stat()))


def remember_inputs(paths: Iterable[str | os.PathLike]) -> None:
    """Count these files (and the files directly in these folders) among the
    inputs no output may replace: validation samples, calibration data, a
    config file."""
    for path in map(Path, paths):
        with contextlib.suppress(OSError):
            if path.is_dir():
                for entry in path.iterdir():
                    if entry.is_file():
                        _remember_input(entry)
            else:
                _remember_input(path)


def is_input_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is (a link to) a file that a model was loaded from in
    this process (the .onnx file or one of its external data files), or one
    given to :func:`remember_inputs`."""
    try:
        return _identity(os.stat(path)) in _INPUT_FILES
    except (OSError, ValueError):
        return False


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    external_files: frozenset[str]  # data files (relative to the model's folder) its tensors referred to

    @contextlib.contextmanager
    def checked(self) -> Iterator[None]:
        """Run the block on the checked input. (The input is checked as it
        is read: nothing is left to wait for. Kept while the CLI wraps its
        conversion in it.)"""
        yield


def load_model(path: str | os.PathLike, *, lazy_external: bool = False) -> onnx.ModelProto:
    """Load and vet ``path``; raises AmpError with what is wrong.

    ``lazy_external``: tensors in external data files stay there (the
    converter reads them one at a time from the model's folder)."""
    return read_model(path, lazy_external=lazy_external).model


def read_model(path: str | os.PathLike, *, lazy_external: bool = False) -> LoadedModel:
    """:func:`load_model`, also naming the external data files it read from."""
    p = Path(path)
    data = _read(p)
    _remember_input(p)
    model = _parse(p, data)
    check_versions(model, str(p))
    check_calls(model, str(p))
    # Serialized bytes without a location entry hold no external tensor (the walk over every tensor is skipped).
    located = _LOCATION_KEY_BYTES in data
    external = list(_external_tensors(model)) if located else []
    in_functions = list(_function_external_tensors(model)) if located else []
    data_files = frozenset(external_info(t).get("location", "") for t in [*external, *in_functions])  # (before reading)
    # The checker reads an external-data model's file itself, to find its data.
    source = str(p) if external or in_functions else data
    if external:
        _check_external_data(external, p)
    if in_functions:
        _check_external_data(in_functions, p)
        _read_external(in_functions, p, name_tensor=True)
    check_input_model(source, str(p))
    if external and not lazy_external:
        _read_external(external, p)
    del data
    return LoadedModel(model, data_files)


# ------------------------------------------------------------------ reading


def _read(p: Path) -> bytes:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except NotADirectoryError:
        raise InputError(f"{p}: no such file (a parent of it is not a folder)") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read the model ({_detail(e)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{p}: is a directory, not an .onnx file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: not a regular file (a device, pipe or socket); give the path of an .onnx file")
    if st.st_size == 0:
        raise InputError(f"{p}: empty file (an interrupted download or export?)")
    try:
        return p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read the model ({_detail(e)})") from None


def _parse(p: Path, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeError/ValueError in some builds
        raise InputError(f"{p}: not a readable ONNX model ({_detail(e)}); {_what_is_it(data)}") from None
    if model.ir_version == 0 or not model.HasField("graph"):
        missing = "no IR version" if model.ir_version == 0 else "no graph"
        raise InputError(f"{p}: not an ONNX model (the bytes parse, but there is {missing}); {_what_is_it(data)}")
    if len(model.graph.output) == 0:
        raise InputError(f"{p}: the model's graph has no outputs: nothing to convert (a corrupt file?)")
    return model


_SIGNATURES = (
    (b"version https://git-lfs", "it is a Git LFS pointer, not the model: fetch the file with `git lfs pull`"),
    (b"PK\x03\x04", "it is a zip archive (a PyTorch checkpoint or a zipped model?), not an .onnx file"),
    (b"\x1f\x8b", "it is gzip-compressed: decompress it first"),
    (b"\x89PNG", "it is a PNG image, not an .onnx file"),
    (b"\xff\xd8\xff", "it is a JPEG image, not an .onnx file"),
    (b"\x89HDF", "it is an HDF5 file (Keras?), not an .onnx file"),
    (b"\x80\x02", "it looks like a Python pickle (a PyTorch checkpoint?), not an .onnx file"),
)


def _what_is_it(data: bytes) -> str:
    """A guess at what the bytes are, for a file that is not an ONNX model."""
    for magic, text in _SIGNATURES:
        if data.startswith(magic):
            return text
    head = data[:512]
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and decoded.strip() and all(c.isprintable() or c in "\r\n\t" for c in decoded):
        if decoded.lstrip().startswith("<"):
            return "it looks like the ONNX text format: convert it with onnx.parser.parse_model, then onnx.save"
        return "it is a text file, not a binary .onnx model"
    return "the file is truncated, corrupt or not ONNX: export it again"


# ----------------------------------------------------------------- vetting


def check_versions(model: onnx.ModelProto, label: str) -> None:
    if not MIN_IR_VERSION <= model.ir_version <= onnx.IR_VERSION:
        raise InputError(
            f"{label}: IR version {model.ir_version} is not supported "
            f"(this converter reads {MIN_IR_VERSION} to {onnx.IR_VERSION})"
        )
    opset = model_opsets(model).get("")
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        raise InputError(f"{label}: the model imports no default-domain (ai.onnx) opset")
    if not MIN_OPSET <= opset <= newest:
        hint = "upgrade it with onnx.version_converter" if opset < MIN_OPSET else "a newer onnx package may read it"
        raise InputError(f"{label}: opset {opset} is not supported (this converter handles {MIN_OPSET} to {newest}; {hint})")


def check_calls(model: onnx.ModelProto, label: str) -> None:
    """A call of a local function may leave out inputs and outputs the
    function declares, not add any: onnx's checker lets such a call pass,
    but onnxruntime refuses the model, and onnx's inliner (the emulation
    twin's) fails on it. Checked where onnxruntime checks: the calls of the
    main graph (its subgraphs' too), and of the bodies they call (a function
    nothing calls is not read: onnxruntime loads a model that holds one).
    A model without local functions costs nothing here; in one with, only
    the nodes of a custom domain or with subgraphs are read further (see
    :func:`amp_convert.graph.may_nest`)."""
    if not model.functions:
        return
    for call in reached_calls(model.graph, local_functions(model.functions)):
        node, function = call.node, call.function
        for kind, given, declared in (("inputs", node.input, function.input), ("outputs", node.output, function.output)):
            if len(given) > len(declared):
                raise InputError(
                    f"{label}: node {_label(call.nodes, call.index)!r}{_place(call.within)} calls local function "
                    f"{_function_name(function)} with {len(given)} {kind}, but it declares {len(declared)} (onnxruntime "
                    f"refuses such a call; {_REEXPORT})"
                )


def _place(within: Subgraph | Call | None) -> str:
    """Where nodes ``within`` this are, for a message: in a subgraph (and
    where that is), in the body of a function, or ("") in the main graph."""
    if isinstance(within, Subgraph):
        return f" in {within.attribute} of node {_label(within.nodes, within.index)!r}{_place(within.within)}"
    return f" in the body of {_function_name(within.function)}" if within is not None else ""


def _label(nodes: Sequence[onnx.NodeProto], index: int) -> str:
    """A node's label, as plans name it (:class:`NodeLabels`), for a message."""
    return NodeLabels([n.name for n in nodes], [n.op_type for n in nodes])[index]


def _function_name(function: onnx.FunctionProto) -> str:
    overload = f" (overload {function.overload!r})" if function.overload else ""
    return f"{function.domain}::{function.name}{overload}"


def check_input_model(model: onnx.ModelProto | bytes | str, label: str, *, full_check: bool = False) -> None:
    """The input must pass the ONNX checker: converting a broken model would
    only move the breakage. ``model`` may be the serialized bytes or the path
    (no re-serialization: much faster on large models). ``full_check`` also
    runs strict shape and type inference."""
    if isinstance(model, str):
        from .check import checkable

        model = checkable(model)
    try:  # (onnxruntime's own ops are checked against its schemas, not refused)
        try:
            _check_known(model, full_check)
        except onnx.checker.ValidationError as e:
            declared = _with_declared_domains(model) if "No opset import for domain" in str(e) else None
            if declared is None:
                raise
            _check_known(declared, full_check)  # (as onnxruntime loads it, and as the pipeline converts it)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError, RuntimeError) as e:
        what = "fails ONNX shape inference" if isinstance(e, onnx.shape_inference.InferenceError) else "fails the ONNX checker"
        if isinstance(e, UnicodeDecodeError):  # the checker's message quotes a name that is not UTF-8
            raise InputError(f"{label}: the input model {what} on a name that is not UTF-8 (a corrupt file?)") from None
        raise InputError(f"{label}: the input model {what}: {_detail(e)} ({_REEXPORT})") from None


def _check_known(model: onnx.ModelProto | bytes | str, full_check: bool) -> None:
    """onnx's checker, knowing onnxruntime's ops."""
    check_with_extras(
        lambda: onnx.checker.check_model(model, full_check=full_check), model if isinstance(model, onnx.ModelProto) else None
    )


def _with_declared_domains(model: onnx.ModelProto | bytes | str) -> onnx.ModelProto | None:
    """A copy of ``model`` with the opset imports onnxruntime assumes
    (:func:`~amp_convert.domains.declare_domains`), or None where it lacks none."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
    elif isinstance(model, bytes):
        copy = onnx.load_model_from_string(model)
    else:
        copy = onnx.load(model, load_external_data=False)
    return copy if declare_domains(copy) else None


# ----------------------------------------------------------- external data


# How an external tensor's "location" entry is serialized (StringStringEntryProto
# key, field 1: length 8, "location"): every external tensor has one (the
# checker refuses one without it).
_LOCATION_KEY_BYTES = b"\x0a\x08location"


def _external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Tensors whose data is in external files."""
    for t in all_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


def _int_field(info: dict[str, str], key: str, label: Path, tensor: onnx.TensorProto) -> int | None:
    value = info.get(key)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise InputError(f"{label}: tensor {tensor.name!r} has an invalid external data {key} {_detail(value)}")
    return number


def _check_external_data(tensors: list[onnx.TensorProto], label: Path) -> None:
    """External data must stay inside the model's folder and be long enough.
    (Each location is checked once, for the first tensor naming it: the
    tensors of a large model share a few files.)"""
    try:
        base = label.parent.resolve()
    except (OSError, RuntimeError) as e:
        raise InputError(f"{label}: cannot resolve the model's folder ({_detail(e)})") from None
    sizes: dict[str, int] = {}  # location -> its file's size
    for tensor in tensors:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        size = sizes.get(location) if isinstance(location, str) else None
        if size is None:
            size = sizes[location] = _checked_location(base, location, tensor, label)
        offset = _int_field(info, "offset", label, tensor) or 0
        length = _int_field(info, "length", label, tensor)
        expected = _expected_bytes(tensor)
        if length is not None and expected is not None and length != expected:
            raise InputError(
                f"{label}: tensor {tensor.name!r} has external data length {length}, "
                f"but its shape and type need {expected} bytes (a corrupt or mismatched model)"
            )
        needed = offset + (length if length is not None else expected or 0)
        if needed > size or offset > size:
            raise InputError(
                f"{label}: external data file {location!r} is too short for tensor {tensor.name!r} "
                f"(needs {max(needed, offset)} bytes, has {size})"
            )


def _checked_location(base: Path, location: object, tensor: onnx.TensorProto, label: Path) -> int:
    """The size of the file at external data ``location`` (of ``tensor``,
    in the folder ``base``), refused where it is not a relative path to a
    regular file inside the folder that the system opens as written."""
    if not location:
        raise InputError(f"{label}: tensor {tensor.name!r} has external data without a location")
    if not isinstance(location, str) or "\x00" in location:
        raise InputError(f"{label}: tensor {tensor.name!r} has an invalid external data location {_detail(location)}")
    try:
        absolute = Path(location).is_absolute() or bool(Path(location).drive)
        target = (base / location).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise InputError(f"{label}: tensor {tensor.name!r}: bad external data location {location!r} ({_detail(e)})") from None
    if absolute:
        raise InputError(
            f"{label}: tensor {tensor.name!r} has an absolute external data location ({_detail(location)}); refused: "
            "external data must be a relative path inside the model's folder"
        )
    if not target.is_relative_to(base):
        lexical = os.path.normpath(location).split(os.sep)[0] == os.pardir
        via = "" if lexical else " through a symbolic link"
        raise InputError(
            f"{label}: tensor {tensor.name!r} points outside the model's folder{via} ({_detail(location)}); refused: "
            "external data must be a relative path inside the model's folder"
        )
    if not target.is_file():
        what = "is not a regular file" if target.exists() else "is missing"
        raise InputError(f"{label}: external data file {location!r} of tensor {tensor.name!r} {what}")
    why = _why_unopenable(base, location)
    if why is not None:
        raise InputError(
            f"{label}: tensor {tensor.name!r} has external data location {location!r}, which cannot be opened "
            f"as written: {why} (a '..' needs the folder it steps out of; onnxruntime opens the path as written); refused"
        )
    _remember_input(target)
    return target.stat().st_size


def _why_unopenable(base: Path, location: str) -> str | None:
    """Why the system cannot open ``location`` in ``base`` as written (None
    if it can). Resolved, the location names a file in the folder; but
    ``sub/../w.bin`` opens only where ``sub`` is a folder: onnx's checker
    cleans the path first, the system and onnxruntime do not."""
    try:
        os.stat(base / location)  # (pathlib keeps '..' as written)
        return None
    except OSError as e:
        parts = Path(location).parts
        for i, part in enumerate(parts[:-1]):
            folder = base.joinpath(*parts[: i + 1])
            if part != os.pardir and not os.path.isdir(folder):
                name = Path(*parts[: i + 1]).as_posix()
                return f"{name!r} is not a folder" if os.path.exists(folder) else f"folder {name!r} is missing"
        return _detail(e.strerror or e)


def _expected_bytes(tensor: onnx.TensorProto) -> int | None:
    """Size of a tensor's raw data from its shape and type (None when the type
    has no fixed size or a packing this check does not know)."""
    if tensor.data_type in _SUB_BYTE or tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return (element_count(tensor) + 1) // 2 if tensor.data_type in _PACKED_4BIT else None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return element_count(tensor) * itemsize


def _types(*names: str) -> frozenset[int]:
    return frozenset(getattr(onnx.TensorProto, name) for name in names if hasattr(onnx.TensorProto, name))


_PACKED_4BIT = _types("INT4", "UINT4", "FLOAT4E2M1")
_SUB_BYTE = _PACKED_4BIT | _types("INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")


def _function_external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Tensor attributes of the model's local functions (sparse ones' values
    and indices too) whose data is in external files."""
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                for tensor in attribute_tensors(attr):
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        yield tensor


def _read_external(tensors: list[onnx.TensorProto], label: Path, name_tensor: bool = False) -> None:
    """Read these external tensors' data into them: the model's (loaded
    whole), or its local functions' (the converter leaves those as they
    are, and writes only the graphs' tensors to the output's data file: the
    output must not point at the input's), whose failure names the tensor."""
    for tensor in tensors:
        try:
            inline_external(tensor, label.parent)
        except (OSError, ValueError, RuntimeError) as e:
            of = f" of tensor {tensor.name!r}" if name_tensor else ""
            raise InputError(f"{label}: cannot read the external data{of} ({_detail(e)})") from None
    _check_read_lengths(tensors, label)


def _check_read_lengths(tensors: list[onnx.TensorProto], label: Path) -> None:
    """Tensors whose external data was read in hold the bytes their shape and type need."""
    for tensor in tensors:
        expected = _expected_bytes(tensor)
        if expected is not None and len(tensor.raw_data) != expected:
            raise InputError(
                f"{label}: the external data of tensor {tensor.name!r} has {len(tensor.raw_data)} bytes, "
                f"its shape and type need {expected} ({_REEXPORT})"
            )


# ------------------------------------------------------------------ helpers


def _detail(e: object) -> str:
    """A library's message (or a value), as one line of bounded length."""
    text = e if isinstance(e, str) else repr(e) if isinstance(e, bytes) else str(e)
    text = " ".join(text.split()) or type(e).__name__
    if len(text) > MAX_DETAIL:
        text = text[: MAX_DETAIL - 3].rstrip() + "..."
    return text
