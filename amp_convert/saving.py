"""Saving: the output appears whole or not at all.

Everything is written to a temporary file in the target folder
(``.<name>.<random>.tmp``), flushed to disk and renamed over the target, so
an interrupted write leaves the previous file (or none). Ctrl-C (SIGINT),
SIGTERM and SIGHUP during the write remove the temporary file and raise
:class:`WriteInterrupted` (a KeyboardInterrupt: the CLI prints one line and
exits with 130). Only SIGKILL or a power cut can leave a temporary file
behind; the target is still never partial.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx

from .errors import AmpError
from .external import PROTOBUF_LIMIT, Payload, load_external_values, payload, write_with_external_data
from .load import is_input_file

_CAUGHT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class WriteInterrupted(KeyboardInterrupt):
    """A signal stopped a write; the target was left as it was."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} while writing")
        self.signum = signum


class _Interrupts:
    """While a write is under way, SIGINT/SIGTERM/SIGHUP raise WriteInterrupted
    (the default action of SIGTERM and SIGHUP kills Python without running
    ``finally`` blocks, so the temporary file would stay). Inside ``held()``
    a signal is only noted, and raised when the block ends: creating the
    temporary file and remembering its name, or renaming it and forgetting
    it, are never split. (Blocking signals with pthread_sigmask would not do:
    the kernel hands a blocked signal to another thread, onnxruntime's, and
    Python runs the handler in the main thread all the same.)

    Handlers are installed only in the main thread, where Python runs them,
    and the previous ones are restored on exit."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.holding = 0
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for signum in _CAUGHT_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for signum, old in self.previous.items():
            signal.signal(signum, old)

    def _handler(self, signum, _frame) -> None:
        if self.pending is not None:  # a second signal while cleaning up: let the cleanup finish
            return
        self.pending = signum
        if not self.holding:
            raise WriteInterrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
        if not self.holding and self.pending is not None:
            raise WriteInterrupted(self.pending)


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A temporary folder (in the system's) that no SIGINT, SIGTERM or
    SIGHUP leaves behind: onnxruntime reads a model with external data only
    from files, and a large model's copy there is as large as the model."""
    folder: Path | None = None
    with _Interrupts() as interrupts:
        try:
            with interrupts.held():
                folder = Path(tempfile.mkdtemp(prefix="amp-convert-"))
            yield folder
        finally:
            with interrupts.held():
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)


def check_output_path(target: str | os.PathLike) -> Path:
    """Raise AmpError unless ``target`` can be written: its folder exists and
    is writable, it is not a directory, and it is not a file an input model
    was read from (the model or its external data). Returns the folder. The
    CLI may call it for every output before converting, so that nothing is
    written when one of them is bad."""
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.exists():
        raise AmpError(f"{target}: folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise AmpError(f"{target}: {folder} is not a folder")
    if target.is_dir():
        raise AmpError(f"{target}: is a directory; give a file name")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        # The rename that makes writes atomic would replace the link, pipe or device itself.
        raise AmpError(f"{target}: is a symbolic link, pipe or device, not a regular file; give a plain file name")
    if is_input_file(target):
        raise AmpError(
            f"{target}: is one of the inputs (the model, its external data, samples, calibration data or the config); "
            "choose another output (inputs are never overwritten)"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AmpError(f"{target}: folder {folder} is not writable")
    return folder


def _create_temporary(folder: Path, name: str) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` in ``folder``, created with
    mode 0666 minus the umask, as any new file (mkstemp's would be 0600)."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = folder / f".{name[:200]}.{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise AmpError(f"{folder}: cannot create a temporary file (100 names taken)")


def _keep_mode(target: Path, tmp: Path) -> None:
    """A file written over an existing one keeps that file's permissions."""
    try:
        mode = target.stat().st_mode & 0o7777
    except OSError:
        return
    os.chmod(tmp, mode)


def _fsync(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _flush_to_disk(path: Path, meanwhile: Callable[[], None] | None) -> None:
    """fsync ``path``; with ``meanwhile``, on another thread while it runs
    here (the fsync waits on the disk, not on the interpreter)."""
    if meanwhile is None:
        _fsync(path)
        return
    failed: list[OSError] = []

    def flush() -> None:
        try:
            _fsync(path)
        except OSError as e:
            failed.append(e)

    flusher = threading.Thread(target=flush, name="amp-convert-fsync", daemon=True)
    flusher.start()
    meanwhile()  # (raising: the caller removes the file; the thread, a daemon, is left to end)
    flusher.join()
    if failed:
        raise failed[0]


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; not every platform or filesystem allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, meanwhile: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target``
    only if the block completes. Errors writing become AmpError (one line);
    signals become WriteInterrupted; the temporary file never outlives the
    block (except after SIGKILL). ``meanwhile`` runs (in this thread) while
    the written file is flushed to disk, before the rename: what it raises
    leaves the target as it was."""
    target = Path(target)
    folder = check_output_path(target)
    tmp_path: Path | None = None
    with _Interrupts() as interrupts:
        try:
            with interrupts.held():  # no interrupt between creating the file and remembering it
                tmp_path = _create_temporary(folder, target.name)
            yield tmp_path
            _keep_mode(target, tmp_path)
            _flush_to_disk(tmp_path, meanwhile)
            with interrupts.held():  # nor between the rename and forgetting the file
                os.replace(tmp_path, target)
                tmp_path = None
            _fsync_folder(folder)
        except OSError as e:
            raise AmpError(f"{target}: cannot write ({e.strerror or e}); nothing was written") from None
        finally:
            if tmp_path is not None:
                with contextlib.suppress(OSError):
                    tmp_path.unlink()


def writes_external(mode: str, has_external: bool, size: int) -> bool:
    """Whether a model is written with external data under ``mode``
    (always, never, auto: where it read tensors from data files or is
    over protobuf's 2 GiB)."""
    return mode == "always" or (mode == "auto" and (has_external or size > PROTOBUF_LIMIT))


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external: bool = False,
    source_dir: str | os.PathLike | None = None,
    before_commit: Callable[[Path], None] | None = None,
    measured: Payload | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Write ``model`` to ``path`` atomically.

    ``external``: large tensors go to ``<name>.data`` beside it, written
    tensor by tensor (tensors still in the input's data files, under
    ``source_dir``, are streamed across). Otherwise everything goes into the
    one file, which protobuf limits to 2 GiB. ``before_commit`` sees the
    written model (with its data file beside it) before it replaces
    anything; raising there writes nothing. ``measured``: the model's
    :func:`payload` when the caller has measured it already. ``meanwhile``:
    run once the model is written, before it replaces anything (while it is
    flushed to disk, where it is one file); raising there writes nothing.
    """
    target = Path(path)
    source = Path(source_dir) if source_dir is not None else None
    if not external:
        measured = measured or payload(model)
        if measured.has_external:
            load_external_values(model, source or target.parent)
        if measured.total > PROTOBUF_LIMIT:
            raise AmpError(
                f"{path}: the converted model is over 2 GiB, more than a single .onnx file can hold; "
                "use `external_data` auto or always; nothing was written"
            )
        with atomic_path(target, meanwhile) as tmp:
            write_model_file(model, tmp, measured.serialized)
            if before_commit is not None:
                before_commit(tmp)
        return
    data_name = f"{target.name}.data"
    try:
        data_name.encode("utf-8")
    except UnicodeEncodeError:  # (a byte the file system allows, which no ONNX string can hold)
        raise AmpError(
            f"{path}: the model would name its data file {data_name!r}, and ONNX strings are UTF-8; "
            "choose an output name in UTF-8; nothing was written"
        ) from None
    with staged_folder(target, [target.name, data_name]) as stage:
        write_with_external_data(model, stage / target.name, data_name, source)
        if before_commit is not None:
            before_commit(stage / target.name)
        if meanwhile is not None:
            meanwhile()


def write_model_file(model: onnx.ModelProto, path: Path, serialized: bytes | None = None) -> None:
    """Serialize ``model`` into one file (onnx.save would first walk every
    node's attributes looking for external tensors); ``serialized``: its
    bytes, when the caller has them already."""
    with open(path, "wb") as f:
        f.write(model.SerializeToString() if serialized is None else serialized)


@contextlib.contextmanager
def staged_folder(target: Path, names: list[str]) -> Iterator[Path]:
    """A temporary folder beside ``target`` in which files ``names`` are
    written; on success they replace the files of the same names in the
    target's folder (data files first, the model last), all renames inside
    one signal-safe section. On failure nothing outside the stage changes."""
    folder = check_output_path(target)
    for name in names[1:]:
        check_output_path(folder / name)
    stage: Path | None = None
    with _Interrupts() as interrupts:
        try:
            with interrupts.held():
                stage = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.", suffix=".tmp", dir=folder))
            yield stage
            with interrupts.held():
                for name in [*names[1:], names[0]]:
                    written = stage / name
                    if written.exists():
                        _keep_mode(folder / name, written)
                        os.replace(written, folder / name)
            _fsync_folder(folder)
        except OSError as e:
            raise AmpError(f"{target}: cannot write ({e.strerror or e}); nothing was written") from None
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)


class TextFiles:
    """Reports and plans written beside their targets, then put in place
    together: a command writing several files (and a model) either writes
    them all or none. A context: while it is open, signals end it as they
    end :func:`atomic_path`, and what it holds unplaced when it closes (a
    failure, or no :meth:`place`) is removed."""

    def __init__(self) -> None:
        self._written: list[tuple[Path, Path]] = []  # (temporary, target)
        self._interrupts = _Interrupts()

    def write(self, target: str | os.PathLike, text: str) -> None:
        """Write ``text`` for ``target`` (not in place yet); errors become AmpError."""
        target = Path(target)
        folder = check_output_path(target)
        try:
            with self._interrupts.held():  # (created and remembered together)
                tmp = _create_temporary(folder, target.name)
                self._written.append((tmp, target))
            tmp.write_text(text, encoding="utf-8")
            _keep_mode(target, tmp)
            _fsync(tmp)
        except OSError as e:
            raise AmpError(f"{target}: cannot write ({e.strerror or e}); nothing was written") from None

    def place(self) -> None:
        """Rename every file written over its target."""
        with self._interrupts.held():
            while self._written:
                tmp, target = self._written[0]
                try:
                    os.replace(tmp, target)
                except OSError as e:
                    raise AmpError(f"{target}: cannot write ({e.strerror or e})") from None
                self._written.pop(0)
                _fsync_folder(target.parent)

    def __enter__(self) -> TextFiles:
        self._interrupts.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            for tmp, _ in self._written:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            self._written.clear()
        finally:
            self._interrupts.__exit__(*exc)
