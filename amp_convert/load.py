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
import mmap
import os
import pickle
import signal
import stat
import struct
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.defs
import onnx.shape_inference

from .errors import AmpError
from .external import all_tensors, attribute_tensors, element_count, external_info, inline_external
from .graph import Call, NodeLabels, Subgraph, local_functions, reached_calls
from .ortschema import check_with_extras, declare_domains
from .schema import model_opsets

MIN_IR_VERSION = 3
MIN_OPSET = 7
MAX_DETAIL = 240  # characters of a library's message quoted in ours

_REEXPORT = "re-export or repair the model"

# Identity of every file a model was read from in this process (the model
# files and their external data): device, inode, and size and mtime, so that
# a new file reusing a freed inode is not mistaken for an input. save.py
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


class BackgroundCheck:
    """The ONNX checker run on the input in a forked child, while the caller
    goes on converting on another core (the checker is C++ that holds the
    GIL: a thread would not run beside the converter). :meth:`wait` gives
    its verdict: nothing, or the AmpError :func:`check_input_model` raises.

    Before it checks, the child can work things out from the input's bytes
    for the converter (``ahead``: see :mod:`amp_convert.ahead`), which
    :meth:`ahead_result` hands over by name. The child writes frames (a
    pickled (name, value) pair, see :func:`_write_frame`): what it worked
    out, a frame saying it is done with that (also when it failed), then its
    verdict. Where the system has shared memory, a large frame's pickle,
    and the buffers a value marks for it (``pickle.PickleBuffer``, as
    :class:`~amp_convert.safety.ConstantFacts` does with its converted
    values), go there: the child does not wait for the caller to read them
    (it goes on to its check), and the caller maps them rather than copying
    them through the pipe. Elsewhere everything goes through the pipe, and
    the caller should ask for every result promptly: a large frame not read
    holds the child, and its check, back.

    Used where nothing but the converter's own Python code touches the model
    before the verdict: no onnxruntime session, nothing written."""

    def __init__(self, pid: int, read_end: int, path: Path, ahead: bool = False, shared: int | None = None) -> None:
        self._pid, self._read_end, self._path = pid, read_end, path
        self._shared = shared  # the memory file the child puts large buffers in (see _write_frame), or None
        self._verdict: AmpError | bool | None = False  # False: not yet known
        self._ahead: dict[str, object] = {}  # read, not yet handed over
        self._ahead_done = not ahead  # (no more ahead frames will come)
        self._said: tuple[str | None] | None = None  # the verdict frame's value, once read
        self._ended = False  # the verdict frame, or the end of the pipe, was read

    @classmethod
    def start(
        cls, source: bytes | str, path: Path, ahead: Callable[[bytes], Iterator[tuple[str, object]]] | None = None
    ) -> BackgroundCheck | None:
        """Check ``source`` (the file's bytes, or its path) in a child; None
        when no child can be made (the caller checks it itself). ``ahead``
        runs first, in the child, on the bytes (not on a path)."""
        ahead = ahead if isinstance(source, bytes) else None
        read_end, write_end = os.pipe()
        shared = _memory_file() if ahead is not None else None
        try:
            with warnings.catch_warnings():  # (3.12+ warns of fork with threads: numpy's idle BLAS pool here)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # (out of memory or processes)
            _close_all(read_end, write_end, shared)
            return None
        if pid == 0:  # the child: work ahead, check, write what it found, leave without running any cleanup
            try:
                os.close(read_end)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _die_with_parent()
                if ahead is not None:
                    with contextlib.suppress(Exception):  # (what it could not work out, the converter does)
                        out = _SharedOut(shared) if shared is not None else None
                        for found in ahead(source):
                            _write_frame(write_end, found, out)
                    _write_frame(write_end, (_AHEAD_DONE, None))
                try:
                    check_input_model(source, str(path))
                    verdict = None
                except AmpError as e:
                    verdict = str(e)
                _write_frame(write_end, (_VERDICT, verdict))
            finally:
                os._exit(0)
        os.close(write_end)
        return cls(pid, read_end, path, ahead is not None, shared)

    def ahead_result(self, name: str) -> object | None:
        """What the child worked out ahead under ``name`` (waiting for it);
        None if it has nothing under that name, or handed it over before."""
        if self._verdict is not False:
            return None
        try:
            while name not in self._ahead and not (self._ahead_done or self._ended):
                self._read_next()
        except Exception:  # (a frame that could not be read: the file is checked here instead, see wait)
            self._ended = True
        except BaseException:
            self.cancel()
            raise
        return self._ahead.pop(name, None)

    def _read_next(self) -> None:
        frame = _read_frame(self._read_end, self._shared)
        if frame is None:  # (the child died, or wrote what cannot be read)
            self._ended = True
            return
        name, value = frame
        if name == _VERDICT:
            self._said, self._ended = (value,), True
        elif name == _AHEAD_DONE:
            self._ahead_done = True
        else:
            self._ahead[name] = value

    def wait(self) -> None:
        """Block until the checker is done; raise its AmpError if the input fails it."""
        if self._verdict is False:
            try:
                while not self._ended:
                    self._read_next()
                if self._said is None:  # (no verdict will come: stop a child that may be stuck writing)
                    with contextlib.suppress(OSError):
                        os.kill(self._pid, signal.SIGKILL)
                try:
                    exited = os.WIFEXITED(os.waitpid(self._pid, 0)[1])
                except ChildProcessError:  # (SIGCHLD ignored: the system reaped it; a whole verdict came through)
                    exited = True
            except BaseException:  # interrupted while waiting: leave no child behind
                self.cancel()
                raise
            self._close()
            if not (exited and self._said is not None):  # the child died (out of memory?): check the file here
                try:
                    check_input_model(str(self._path), str(self._path))
                    self._verdict = None
                except AmpError as e:
                    self._verdict = e
            else:
                self._verdict = None if self._said[0] is None else AmpError(self._said[0])
        if self._verdict is not None:
            raise self._verdict

    def cancel(self) -> None:
        """Stop the child (the caller is being interrupted)."""
        if self._verdict is False:
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            self._close()
            self._verdict = None

    def _close(self) -> None:
        """Close the pipe and the memory file (what was mapped from it stays)."""
        _close_all(self._read_end, self._shared)
        self._shared = None
        self._ahead.clear()


# The frames' names for the end of the ahead results and for the verdict (no result is named so).
_AHEAD_DONE, _VERDICT = "\0ahead-done", "\0verdict"
# A frame's header: the length of its pickle in the pipe (0: the pickle is
# in shared memory, at the first place listed), and how many places in the
# memory file follow (each an offset and a length); then the pickle, if in the pipe.
_FRAME_HEADER = struct.Struct("<QI")
_BUFFER_PLACE = struct.Struct("<QQ")
_PIPE_PICKLE_MOST = 1 << 14  # (a larger pickle goes to shared memory, where there is some: a pipe holds 64 KiB)


def _close_all(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _memory_file() -> int | None:
    """A file in memory, shared with the child made next (Linux); None where there is none."""
    try:
        return os.memfd_create("amp-convert-ahead", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None


class _SharedOut:
    """The child's side of the memory file: buffers written one after the
    other, each at a page boundary (where the caller maps it)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.end = fd, 0

    def put(self, view: memoryview) -> tuple[int, int]:
        offset, n = self.end, view.nbytes
        done = 0
        while done < n:
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.end = -(-(offset + n) // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY
        return offset, n


def _write_frame(fd: int, value: object, shared: _SharedOut | None = None) -> None:
    """A frame (see _FRAME_HEADER). With ``shared``, a large pickle and the
    buffers the value marks (``pickle.PickleBuffer``) go there; else all
    goes into the pipe."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append if shared is not None else None)
    views = [b.raw() for b in buffers]
    in_pipe = shared is None or len(data) <= _PIPE_PICKLE_MOST
    if not in_pipe:
        views.insert(0, memoryview(data))
    places = b"".join(_BUFFER_PLACE.pack(*shared.put(v)) for v in views) if views else b""
    header = _FRAME_HEADER.pack(len(data) if in_pipe else 0, len(views)) + places
    for part in (header, data) if in_pipe else (header,):  # (the pickle, which may be large, is not copied again)
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


def _read_frame(fd: int, shared: int | None = None) -> tuple[str, object] | None:
    """The next frame's (name, value), its shared buffers mapped (read-only)
    from the memory file ``shared``; None where the child stopped before a
    whole frame."""
    header = _read_exactly(fd, _FRAME_HEADER.size)
    if header is None:
        return None
    length, count = _FRAME_HEADER.unpack(header)
    table = _read_exactly(fd, count * _BUFFER_PLACE.size) if count else b""
    if table is None or not (length or count):
        return None
    places = list(_BUFFER_PLACE.iter_unpack(table))
    try:
        data = _read_exactly(fd, length) if length else _mapped(shared, *places.pop(0))
        if data is None:
            return None
        name, value = pickle.loads(data, buffers=[_mapped(shared, *place) for place in places])
    except Exception:  # (a torn frame: as if the child had died)
        return None
    return name, value


def _mapped(shared: int | None, offset: int, length: int) -> mmap.mmap | bytes:
    """A read-only map of ``length`` bytes of the memory file, its pages
    mapped at once (all of it is read: page by page, first reads cost twice)."""
    if shared is None:
        raise ValueError("a frame with shared buffers, but no memory file")
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(shared, length, flags=flags, prot=mmap.PROT_READ, offset=offset) if length else b""


def _read_exactly(fd: int, n: int) -> bytearray | None:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return buffer


def _die_with_parent() -> None:
    """Linux: the checker child is killed with its parent (SIGKILL leaves no orphan)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Below this many bytes of model the checker takes a few milliseconds: not worth
# a process. Above the second, the child's own copy of the model costs more
# memory than the time it saves is worth (conversion is then mostly tensor work).
BACKGROUND_CHECK_BYTES = 4 << 20
BACKGROUND_CHECK_MAX_BYTES = 256 << 20


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    external_files: frozenset[str]  # data files (relative to the model's folder) its tensors referred to
    check: BackgroundCheck | None = field(default=None, repr=False)  # the checker, when still running

    @contextlib.contextmanager
    def checked(self) -> Iterator[None]:
        """Run the block while the checker finishes; leave it only with the
        input checked. A failing input's error wins over any error the
        block raised on it (as when the checker ran first)."""
        if self.check is None:
            yield
            return
        try:
            yield
        except Exception:
            self.check.wait()
            raise
        except BaseException:
            self.check.cancel()
            raise
        self.check.wait()

    def ahead_result(self, name: str) -> object | None:
        """What the checker child worked out ahead under ``name`` (see :func:`read_model`), or None."""
        return self.check.ahead_result(name) if self.check is not None else None


def load_model(path: str | os.PathLike, *, lazy_external: bool = False) -> onnx.ModelProto:
    """Load and vet ``path``; raises AmpError with what is wrong.

    ``lazy_external``: tensors in external data files stay there (the
    converter reads them one at a time from the model's folder)."""
    return read_model(path, lazy_external=lazy_external).model


def read_model(
    path: str | os.PathLike,
    *,
    lazy_external: bool = False,
    background: bool = False,
    ahead: Callable[[bytes], Iterator[tuple[str, object]]] | None = None,
) -> LoadedModel:
    """:func:`load_model`, also naming the external data files it read from.

    ``background``: a large model is checked by a child process on another
    core; the caller must run its work in ``LoadedModel.checked()``.
    ``ahead``: what that child first works out from the model's bytes
    (when they hold all of it): (name, value) pairs, for
    ``LoadedModel.ahead_result(name)``."""
    p = Path(path)
    data = _read(p)
    _remember_input(p)
    check = None
    background = background and BACKGROUND_CHECK_BYTES <= len(data) <= BACKGROUND_CHECK_MAX_BYTES and _can_fork()
    # Serialized bytes without a location entry hold no external tensor (the walk over every tensor is skipped).
    located = _LOCATION_KEY_BYTES in data
    if background and not located:
        # No external data: the child starts before the model is parsed, so
        # the pages the conversion writes were never shared with it (each
        # first write to a shared page would copy it).
        check = BackgroundCheck.start(data, p, ahead)
    try:
        model = _parse(p, data)
        check_versions(model, str(p))
        check_calls(model, str(p))
    except BaseException:
        if check is not None:
            check.cancel()
        raise
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
    if check is None and background and (lazy_external or not external):
        check = BackgroundCheck.start(source, p, ahead)
    if check is None:
        check_input_model(source, str(p))
        if external and not lazy_external:
            _read_external(external, p)
    del data
    return LoadedModel(model, data_files, check)


def _can_fork() -> bool:
    """A child on another core: where there is fork, and another core to run it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return hasattr(os, "fork") and cores > 1


# ------------------------------------------------------------------ reading


def _read(p: Path) -> bytes:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise AmpError(f"{p}: no such file") from None
    except NotADirectoryError:
        raise AmpError(f"{p}: no such file (a parent of it is not a folder)") from None
    except (OSError, ValueError) as e:
        raise AmpError(f"{p}: cannot read the model ({_detail(e)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise AmpError(f"{p}: is a directory, not an .onnx file")
    if not stat.S_ISREG(st.st_mode):
        raise AmpError(f"{p}: not a regular file (a device, pipe or socket); give the path of an .onnx file")
    if st.st_size == 0:
        raise AmpError(f"{p}: empty file (an interrupted download or export?)")
    try:
        return p.read_bytes()
    except OSError as e:
        raise AmpError(f"{p}: cannot read the model ({_detail(e)})") from None


def _parse(p: Path, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeError/ValueError in some builds
        raise AmpError(f"{p}: not a readable ONNX model ({_detail(e)}); {_what_is_it(data)}") from None
    if model.ir_version == 0 or not model.HasField("graph"):
        missing = "no IR version" if model.ir_version == 0 else "no graph"
        raise AmpError(f"{p}: not an ONNX model (the bytes parse, but there is {missing}); {_what_is_it(data)}")
    if len(model.graph.output) == 0:
        raise AmpError(f"{p}: the model's graph has no outputs: nothing to convert (a corrupt file?)")
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
        raise AmpError(
            f"{label}: IR version {model.ir_version} is not supported "
            f"(this converter reads {MIN_IR_VERSION} to {onnx.IR_VERSION})"
        )
    opset = model_opsets(model).get("")
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        raise AmpError(f"{label}: the model imports no default-domain (ai.onnx) opset")
    if not MIN_OPSET <= opset <= newest:
        hint = "upgrade it with onnx.version_converter" if opset < MIN_OPSET else "a newer onnx package may read it"
        raise AmpError(f"{label}: opset {opset} is not supported (this converter handles {MIN_OPSET} to {newest}; {hint})")


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
                raise AmpError(
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
            raise AmpError(f"{label}: the input model {what} on a name that is not UTF-8 (a corrupt file?)") from None
        raise AmpError(f"{label}: the input model {what}: {_detail(e)} ({_REEXPORT})") from None


def _check_known(model: onnx.ModelProto | bytes | str, full_check: bool) -> None:
    """onnx's checker, knowing onnxruntime's ops."""
    check_with_extras(
        lambda: onnx.checker.check_model(model, full_check=full_check), model if isinstance(model, onnx.ModelProto) else None
    )


def _with_declared_domains(model: onnx.ModelProto | bytes | str) -> onnx.ModelProto | None:
    """A copy of ``model`` with the opset imports onnxruntime assumes
    (:func:`~amp_convert.ortschema.declare_domains`), or None where it lacks none."""
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
        raise AmpError(f"{label}: tensor {tensor.name!r} has an invalid external data {key} {_detail(value)}")
    return number


def _check_external_data(tensors: list[onnx.TensorProto], label: Path) -> None:
    """External data must stay inside the model's folder and be long enough.
    (Each location is checked once, for the first tensor naming it: the
    tensors of a large model share a few files.)"""
    try:
        base = label.parent.resolve()
    except (OSError, RuntimeError) as e:
        raise AmpError(f"{label}: cannot resolve the model's folder ({_detail(e)})") from None
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
            raise AmpError(
                f"{label}: tensor {tensor.name!r} has external data length {length}, "
                f"but its shape and type need {expected} bytes (a corrupt or mismatched model)"
            )
        needed = offset + (length if length is not None else expected or 0)
        if needed > size or offset > size:
            raise AmpError(
                f"{label}: external data file {location!r} is too short for tensor {tensor.name!r} "
                f"(needs {max(needed, offset)} bytes, has {size})"
            )


def _checked_location(base: Path, location: object, tensor: onnx.TensorProto, label: Path) -> int:
    """The size of the file at external data ``location`` (of ``tensor``,
    in the folder ``base``), refused where it is not a relative path to a
    regular file inside the folder that the system opens as written."""
    if not location:
        raise AmpError(f"{label}: tensor {tensor.name!r} has external data without a location")
    if not isinstance(location, str) or "\x00" in location:
        raise AmpError(f"{label}: tensor {tensor.name!r} has an invalid external data location {_detail(location)}")
    try:
        absolute = Path(location).is_absolute() or bool(Path(location).drive)
        target = (base / location).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise AmpError(f"{label}: tensor {tensor.name!r}: bad external data location {location!r} ({_detail(e)})") from None
    if absolute:
        raise AmpError(
            f"{label}: tensor {tensor.name!r} has an absolute external data location ({_detail(location)}); refused: "
            "external data must be a relative path inside the model's folder"
        )
    if not target.is_relative_to(base):
        lexical = os.path.normpath(location).split(os.sep)[0] == os.pardir
        via = "" if lexical else " through a symbolic link"
        raise AmpError(
            f"{label}: tensor {tensor.name!r} points outside the model's folder{via} ({_detail(location)}); refused: "
            "external data must be a relative path inside the model's folder"
        )
    if not target.is_file():
        what = "is not a regular file" if target.exists() else "is missing"
        raise AmpError(f"{label}: external data file {location!r} of tensor {tensor.name!r} {what}")
    why = _why_unopenable(base, location)
    if why is not None:
        raise AmpError(
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
            raise AmpError(f"{label}: cannot read the external data{of} ({_detail(e)})") from None
    _check_read_lengths(tensors, label)


def _check_read_lengths(tensors: list[onnx.TensorProto], label: Path) -> None:
    """Tensors whose external data was read in hold the bytes their shape and type need."""
    for tensor in tensors:
        expected = _expected_bytes(tensor)
        if expected is not None and len(tensor.raw_data) != expected:
            raise AmpError(
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
