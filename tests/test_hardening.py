"""Hardening (issue 6): a CI step must fail loudly and cleanly, and a converter
must never destroy or half-write a model.

* every bad input exits with code 2 and one line on stderr, no traceback, no
  file created or touched, the input unchanged (the real console script, run
  as a subprocess; the cases tests/test_cli.py covers are not repeated);
* writes are atomic, also when the process is interrupted mid-write;
* the same input and options give byte-identical files in separate processes;
* converting a converted model again adds no Cast and changes no output bit.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import run
from onnx import TensorProto, helper, numpy_helper

from amp_convert import ConvertOptions, convert
from amp_convert import saving as amp_save
from amp_convert.cleanup import count_casts
from amp_convert.errors import AmpError
from amp_convert.inputs import make_source
from amp_convert.load import load_model
from amp_convert.saving import TextFiles, save_model
from models.zoo_inputs import load_manifest, make_inputs

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "models" / "zoo"
EXE = Path(sys.executable).with_name("amp-convert")
OLD = b"the previous output: must survive every failure\n"
F32 = TensorProto.FLOAT


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder``: file bytes, link targets, folders."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


def assert_refused(proc: subprocess.CompletedProcess, fragment: str, before: dict, folder: Path) -> str:
    """Exit code 2, one line on stderr naming the problem, nothing written."""
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("amp-convert: error: "), line
    assert fragment in line, line
    assert len(line) < 600
    assert snapshot(folder) == before  # no output, no temporary file, input and old output untouched
    return line


# ------------------------------------------------------------- bad models


def _model(nodes, inputs=None, outputs=None, opset: int = 17, ir_version: int = 8, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs if inputs is not None else [helper.make_tensor_value_info("x", F32, [2, 4])],
        outputs if outputs is not None else [helper.make_tensor_value_info("y", F32, [2, 4])],
        list(initializers),
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def _save(tmp: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Path:
    path = tmp / name
    path.write_bytes(model.SerializeToString())
    return path


def _write(tmp: Path, data: bytes, name: str = "model.onnx") -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _zoo_bytes(name: str) -> bytes:
    return (ZOO / f"{name}.onnx").read_bytes()


def _corrupt_graph(tmp: Path) -> Path:
    """Bytes overwritten in the middle of the graph's nodes (flips in weight
    data cannot be detected: ONNX files carry no checksum)."""
    data = _zoo_bytes("resnet50")
    model = onnx.ModelProto.FromString(data)
    middle = model.graph.node[len(model.graph.node) // 2].SerializeToString()
    at = data.find(middle)
    assert at > 0
    rng = random.Random(6)
    bad = bytearray(data)
    for i in range(at + 2, at + 18):
        bad[i] = rng.choice([0xFF, 0xFE, 0x80, 0xC3])
    return _write(tmp, bytes(bad))


def _unsorted(tmp: Path) -> Path:
    nodes = [helper.make_node("Relu", ["t"], ["y"]), helper.make_node("Relu", ["x"], ["t"])]
    return _save(tmp, _model(nodes))


def _bad_utf8_name(tmp: Path) -> Path:
    data = _model([helper.make_node("Relu", ["x"], ["y"], name="NODE")]).SerializeToString()
    return _write(tmp, data.replace(b"NODE", b"N\xff\xfeE"))


BAD_INPUTS = {
    "directory": (lambda tmp: (tmp / "model.onnx").mkdir() or tmp / "model.onnx", "is a directory"),
    "empty-file": (lambda tmp: _write(tmp, b""), "empty file"),
    "truncated": (lambda tmp: _write(tmp, _zoo_bytes("resnet50")[: len(_zoo_bytes("resnet50")) // 2]), "truncated, corrupt"),
    "corrupt": (_corrupt_graph, "corrupt"),
    "png": (lambda tmp: _write(tmp, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))), "PNG image"),
    "text": (lambda tmp: _write(tmp, b"name,value\nlr,0.1\n"), "text file"),
    "git-lfs-pointer": (
        lambda tmp: _write(tmp, b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 2291792\n"),
        "git lfs pull",
    ),
    "undefined-tensor": (lambda tmp: _save(tmp, _model([helper.make_node("Add", ["x", "ghost"], ["y"])])), "'ghost'"),
    "unsorted-nodes": (_unsorted, "topologically sorted"),
    "opset-3": (lambda tmp: _save(tmp, _model([helper.make_node("Relu", ["x"], ["y"])], opset=3)), "opset 3 is not supported"),
    "opset-99": (
        lambda tmp: _save(tmp, _model([helper.make_node("Relu", ["x"], ["y"])], opset=99)),
        "opset 99 is not supported",
    ),
    "ir-version-2": (
        lambda tmp: _save(tmp, _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=2)),
        "IR version 2 is not supported",
    ),
    "ir-version-99": (
        lambda tmp: _save(tmp, _model([helper.make_node("Relu", ["x"], ["y"])], ir_version=99)),
        "IR version 99 is not supported",
    ),
    "no-outputs": (lambda tmp: _save(tmp, _model([], inputs=[], outputs=[])), "no outputs"),
    "name-not-utf8": (_bad_utf8_name, "not valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, case):
    build, fragment = BAD_INPUTS[case]
    model = build(tmp_path)
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(model, "-o", out), fragment, before, tmp_path)


def test_bad_input_with_debug_shows_a_traceback_and_still_writes_nothing(tmp_path):
    model = _write(tmp_path, _zoo_bytes("lstm")[:1000])
    before = snapshot(tmp_path)
    proc = cli(model, "-o", tmp_path / "out.onnx", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "InputError" in proc.stderr
    assert snapshot(tmp_path) == before


def test_random_byte_flips_are_refused_with_one_line_or_load(tmp_path):
    """Bytes flipped anywhere in a structure-heavy model: the loader either
    refuses with one bounded line (AmpError) or returns a model, never
    another exception."""
    data = _zoo_bytes("controlflow")
    path = tmp_path / "m.onnx"
    refused = 0
    for seed in range(150):
        rng = random.Random(seed)
        bad = bytearray(data)
        start = rng.randrange(len(bad))
        for i in range(start, min(len(bad), start + rng.choice([1, 4, 16]))):
            bad[i] = rng.randrange(256)
        path.write_bytes(bytes(bad))
        try:
            load_model(path)
        except AmpError as e:
            refused += 1
            assert "\n" not in str(e) and len(str(e)) < 600
    assert refused > 10


# ---------------------------------------------------------- external data


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(a.g)


def external_model(folder: Path) -> Path:
    """lstm.onnx with all its weights in ``folder/weights.bin``."""
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(
        onnx.load(str(ZOO / "lstm.onnx")),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def set_external(path: Path, **entries: str) -> None:
    """Rewrite external-data entries (location, offset, length) of every tensor."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in _tensors(model.graph):
        for entry in tensor.external_data:
            if entry.key in entries:
                entry.value = entries[entry.key]
    path.write_bytes(model.SerializeToString())


def _secret(tmp: Path) -> Path:
    secret = tmp / "secret.bin"
    secret.write_bytes(os.urandom(200_000))
    return secret


def _ext_missing(tmp: Path) -> Path:
    path = external_model(tmp / "m")
    (tmp / "m" / "weights.bin").unlink()
    return path


def _ext_short(tmp: Path) -> Path:
    path = external_model(tmp / "m")
    with open(tmp / "m" / "weights.bin", "r+b") as f:
        f.truncate(1000)
    return path


def _ext_parent(tmp: Path) -> Path:
    _secret(tmp)
    path = external_model(tmp / "m")
    set_external(path, location="../secret.bin")
    return path


def _ext_absolute(tmp: Path) -> Path:
    secret = _secret(tmp)
    path = external_model(tmp / "m")
    set_external(path, location=str(secret))
    return path


def _ext_symlink(tmp: Path) -> Path:
    secret = _secret(tmp)
    path = external_model(tmp / "m")
    (tmp / "m" / "weights.bin").unlink()
    (tmp / "m" / "weights.bin").symlink_to(secret)
    return path


def _ext_through(sub: str) -> Callable[[Path], Path]:
    """``sub/../weights.bin``: lexically the data file beside the model; as
    the system opens it, it goes through ``sub``: a missing folder, a file,
    or a link to a folder outside."""

    def build(tmp: Path) -> Path:
        path = external_model(tmp / "m")
        if sub == "file":
            (tmp / "m" / "sub").write_bytes(b"not a folder")
        elif sub == "link":
            (tmp / "elsewhere" / "inner").mkdir(parents=True)
            (tmp / "elsewhere" / "weights.bin").write_bytes((tmp / "m" / "weights.bin").read_bytes())
            (tmp / "m" / "sub").symlink_to(tmp / "elsewhere" / "inner", target_is_directory=True)
        set_external(path, location="sub/../weights.bin")
        return path

    return build


def _ext_bad_offset(tmp: Path) -> Path:
    path = external_model(tmp / "m")
    set_external(path, offset="-12")
    return path


def _ext_wrong_length(tmp: Path) -> Path:
    path = external_model(tmp / "m")
    set_external(path, length="4")  # every tensor holds more than 4 bytes
    return path


def _ext_no_location(tmp: Path) -> Path:
    path = external_model(tmp / "m")
    model = onnx.load(str(path), load_external_data=False)
    for tensor in _tensors(model.graph):
        kept = [(e.key, e.value) for e in tensor.external_data if e.key != "location"]
        del tensor.external_data[:]
        for key, value in kept:
            tensor.external_data.add(key=key, value=value)
    path.write_bytes(model.SerializeToString())
    return path


EXTERNAL_DATA = {
    "no-location": (_ext_no_location, "doesn't have a location"),
    "missing-file": (_ext_missing, "'weights.bin' of tensor"),
    "short-file": (_ext_short, "too short"),
    "parent-folder": (_ext_parent, "points outside the model's folder (../secret.bin); refused"),
    "absolute-path": (_ext_absolute, "absolute external data location"),
    "symlink-outside": (_ext_symlink, "through a symbolic link"),
    "dotdot-after-a-missing-folder": (
        _ext_through("missing"),
        "has external data location 'sub/../weights.bin', which cannot be opened as written: folder 'sub' is missing",
    ),
    "dotdot-after-a-file": (_ext_through("file"), "which cannot be opened as written: 'sub' is not a folder"),
    "dotdot-after-a-linked-folder": (_ext_through("link"), "outside the model's folder through a symbolic link"),
    "negative-offset": (_ext_bad_offset, "invalid external data offset -12"),
    "length-not-the-tensors": (_ext_wrong_length, "has external data length 4"),
}


@pytest.mark.parametrize("case", sorted(EXTERNAL_DATA))
def test_bad_external_data_is_refused(tmp_path, case):
    build, fragment = EXTERNAL_DATA[case]
    model = build(tmp_path)
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(model, "-o", out), fragment, before, tmp_path)


def test_external_data_inside_the_folder_converts(tmp_path):
    model = external_model(tmp_path / "m")
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "weights.bin").rename(tmp_path / "m" / "sub" / "w.bin")
    set_external(model, location="sub/../sub/w.bin")
    loaded = load_model(model)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in _tensors(loaded.graph))
    onnx.checker.check_model(convert(model, level="O2").model, full_check=True)


def test_a_location_the_system_cannot_open_is_refused_when_loaded(tmp_path):
    """Refused as the model is read, also where its data would be read only
    later (lazily, while writing): onnx's own loader cleans ``sub/..`` away
    and reads the file, so nothing else would stop it before onnxruntime."""
    model = _ext_through("missing")(tmp_path)
    assert onnx.load(str(model)).graph.initializer  # (onnx accepts it)
    for lazy in (False, True):
        with pytest.raises(AmpError, match=r"'sub/\.\./weights\.bin', which cannot be opened as written"):
            load_model(model, lazy_external=lazy)


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_external_data_without_length_entries_converts(tmp_path, level):
    """``length`` is optional in ONNX: the tensor's shape and type give it."""
    model = onnx.load(str(external_model(tmp_path / "m")), load_external_data=False)
    for tensor in _tensors(model.graph):
        kept = [(e.key, e.value) for e in tensor.external_data if e.key != "length"]
        del tensor.external_data[:]
        for key, value in kept:
            tensor.external_data.add(key=key, value=value)
    path = tmp_path / "m" / "model.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "out.onnx"
    proc = cli(path, "-o", out, "--level", level, "-q")
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(out), full_check=True)


def test_output_over_the_inputs_external_data_is_refused(tmp_path):
    model = external_model(tmp_path / "m")
    before = snapshot(tmp_path)
    line = assert_refused(cli(model, "-o", tmp_path / "m" / "weights.bin"), "is one of the inputs", before, tmp_path)
    assert "weights.bin" in line


# ----------------------------------------------------------- output paths


@pytest.fixture
def lstm(tmp_path) -> Path:
    path = tmp_path / "lstm.onnx"
    path.write_bytes(_zoo_bytes("lstm"))
    return path


def test_output_equal_to_the_input_by_another_spelling_is_refused(tmp_path, lstm):
    (tmp_path / "sub").mkdir()
    (tmp_path / "alias.onnx").symlink_to(lstm)
    before = snapshot(tmp_path)
    for spelling in (tmp_path / "sub" / ".." / "lstm.onnx", tmp_path / "alias.onnx"):
        assert_refused(cli(lstm, "-o", spelling), "output is the input", before, tmp_path)


def test_output_that_is_a_directory_is_refused(tmp_path, lstm):
    (tmp_path / "out.onnx").mkdir()
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", tmp_path / "out.onnx"), "is a directory", before, tmp_path)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--report", "{out}"], "given as both -o and --report"),
        (["--report", "{out}.data"], "given as both -o's data file and --report"),
        (["--plan-json", "{out}"], "given as both -o and --plan-json"),
        (["--report", "{tmp}/r.json", "--html", "{tmp}/r.json"], "given as both --report and --html"),
    ],
)
def test_two_outputs_on_one_path_are_refused(tmp_path, lstm, flags, fragment):
    out = tmp_path / "out.onnx"
    before = snapshot(tmp_path)
    args = [f.format(out=out, tmp=tmp_path) for f in flags]
    assert_refused(cli(lstm, "-o", out, *args), fragment, before, tmp_path)


def test_output_that_is_a_symlink_or_a_pipe_is_refused(tmp_path, lstm):
    elsewhere = tmp_path / "elsewhere.onnx"
    elsewhere.write_bytes(OLD)
    link = tmp_path / "link.onnx"
    link.symlink_to(elsewhere)
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", link), "not a regular file", before, tmp_path)
    assert link.is_symlink() and elsewhere.read_bytes() == OLD
    pipes = tmp_path / "pipes"  # (a snapshot would block reading a pipe: compare names only)
    pipes.mkdir()
    pipe = pipes / "pipe.onnx"
    os.mkfifo(pipe)
    proc = cli(lstm, "-o", pipe)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and sorted(p.name for p in pipes.iterdir()) == ["pipe.onnx"]


def test_output_inside_a_file_is_refused(tmp_path, lstm):
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", tmp_path / "lstm.onnx" / "out.onnx"), "is not a folder", before, tmp_path)


def _chmod_stops_writes(folder: Path) -> bool:
    probe = folder / ".probe"
    try:
        probe.write_bytes(b"")
    except PermissionError:
        return True
    probe.unlink()
    return False


def _immutable(folder: Path, on: bool) -> bool:
    """``chattr +i`` (or ``-i``): stops writes into ``folder`` even for root, where the file system allows it."""
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    return subprocess.run([chattr, "+i" if on else "-i", str(folder)], capture_output=True).returncode == 0


def test_output_in_a_read_only_folder_is_refused(tmp_path, lstm):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "out.onnx").write_bytes(OLD)
    folder.chmod(0o555)
    immutable = False
    try:
        # As root, chmod does not stop writes: an immutable folder does (CI runs as root).
        if not _chmod_stops_writes(folder):
            immutable = _immutable(folder, True)
            if not immutable or not _chmod_stops_writes(folder):
                pytest.skip("running as root and neither chmod 0o555 nor chattr +i stops writes here")
        before = snapshot(tmp_path)
        assert_refused(cli(lstm, "-o", folder / "out.onnx"), "not writable", before, tmp_path)
        assert_refused(cli(lstm, "-o", tmp_path / "fine.onnx", "--report", folder / "r.json"), "not writable", before, tmp_path)
    finally:
        if immutable:
            _immutable(folder, False)
        folder.chmod(0o755)


def test_a_bad_output_path_writes_no_other_output(tmp_path, lstm):
    before = snapshot(tmp_path)
    assert_refused(
        cli(lstm, "-o", tmp_path / "missing" / "out.onnx", "--plan-json", tmp_path / "plan.json"),
        "does not exist",
        before,
        tmp_path,
    )


def test_input_that_fails_shape_inference_is_a_usage_error(tmp_path):
    """Through the API: the CLI's validation step happens to refuse this model
    first today (onnxruntime cannot load it), but the converter itself blames
    itself (ConversionError, exit 3) for a broken input."""
    w = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    model = _save(tmp_path, _model([helper.make_node("MatMul", ["x", "w"], ["y"])], initializers=[w]))
    with pytest.raises(AmpError, match="shape inference"):
        convert(model, level="O2")


def _torn_weight(name: str = "w") -> onnx.TensorProto:
    """A float32 weight of 16 values whose raw data ends 2 bytes into a 17th:
    the ONNX checker only refuses raw data that is too short."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), name)
    w.raw_data += b"\x00\x01"
    return w


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_weight_with_torn_raw_data_is_a_usage_error_where_it_is_read(tmp_path, level):
    """Read by a node (by the safety rule at O2, by the lowering at O3): one
    line naming the tensor, exit 2, nothing written. Unread, it is copied."""
    model = _save(tmp_path, _model([helper.make_node("MatMul", ["x", "w"], ["y"])], initializers=[_torn_weight()]))
    onnx.checker.check_model(onnx.load(str(model)))  # (the checker takes it)
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    proc = cli(model, "-o", out, "--level", level, "--no-validate")
    assert_refused(proc, "'w' has 66 bytes of float32 raw data", before, tmp_path)
    unread = _model([helper.make_node("Relu", ["x"], ["y"])], initializers=[_torn_weight("spare")])
    result = convert(unread, level=level, check="none")
    assert len(next(t for t in result.model.graph.initializer if t.name == "spare").raw_data) == 66


CHECKER_FAILURES = {
    "undefined-tensor": ([helper.make_node("Add", ["x", "ghost"], ["y"])], "'ghost'"),
    "unsorted-nodes": ([helper.make_node("Relu", ["t"], ["y"]), helper.make_node("Relu", ["x"], ["t"])], "topologically sorted"),
}


@pytest.mark.parametrize("validate", [["--no-validate"], []], ids=["no-validate", "validate"])
@pytest.mark.parametrize("case", sorted(CHECKER_FAILURES))
def test_bad_input_is_refused_with_or_without_validation(tmp_path, case, validate):
    """The checker's verdict on the input is one line, exit 2 and nothing
    written, also with a bad output option (the input's error is the one
    reported)."""
    nodes, fragment = CHECKER_FAILURES[case]
    model = _save(tmp_path, _model(nodes))
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(model, "-o", out, *validate), fragment, before, tmp_path)
    assert_refused(cli(model, "-o", out, "--report", out, *validate), fragment, before, tmp_path)


@pytest.mark.parametrize("case", sorted(CHECKER_FAILURES))
def test_bad_input_is_refused_by_the_api(tmp_path, case):
    nodes, fragment = CHECKER_FAILURES[case]
    model = _save(tmp_path, _model(nodes))
    with pytest.raises(AmpError, match=fragment):
        convert(model, level="O2")


@pytest.mark.parametrize("case", ["not-a-model", "ir-version"])
def test_input_that_fails_to_load_gets_its_own_error(tmp_path, case):
    """A file that does not parse, or names versions the converter does not
    read, gets its own error (not the checker's)."""
    from amp_convert.load import read_model

    path = tmp_path / "model.onnx"
    if case == "not-a-model":
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(4096))
        fragment = "PNG image"
    else:
        built = _model([helper.make_node("Relu", ["x"], ["y"])])
        built.ir_version = 99
        _save(tmp_path, built)
        fragment = "IR version 99"
    with pytest.raises(AmpError, match=fragment):
        read_model(path, lazy_external=True)
    proc = cli(path, "-o", tmp_path / "out.onnx", "--no-validate")
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_the_command_works_when_sigchld_is_ignored(tmp_path):
    """A parent that ignores SIGCHLD hands that on to the command: a good
    input still converts, a bad one is still refused."""
    good = _model([helper.make_node("Relu", ["x"], ["y"])])
    bad_nodes, fragment = CHECKER_FAILURES["undefined-tensor"]
    ignore = lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # noqa: E731
    for built, code in ((good, 0), (_model(bad_nodes), 2)):
        path = _save(tmp_path, built, f"model{code}.onnx")
        out = tmp_path / f"out{code}.onnx"
        args = [str(EXE), str(path), "-o", str(out), "--no-validate"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300, preexec_fn=ignore)
        assert proc.returncode == code, proc.stderr
        assert out.exists() == (code == 0)
        if code:
            assert fragment in proc.stderr and "Traceback" not in proc.stderr


def _with_constants() -> onnx.ModelProto:
    """A model whose weights and Constant values the conversion lowers:
    one with a value that flushes to zero, one beyond fp16's range (kept
    fp32, or clipped with --clip-initializers)."""
    rng = np.random.default_rng(5)
    w, w2 = rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((32, 4)).astype(np.float32)
    w[0, 0] = 1e-9
    big = np.array([[1e6], [2.0]], np.float32)
    shift = rng.standard_normal((2, 32)).astype(np.float32)
    shift[1, 1] = -2e-8
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Constant", [], ["shift"], name="c", value=numpy_helper.from_array(shift, "shift")),
        helper.make_node("Add", ["h", "shift"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "big"], ["m"], name="scale"),
        helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2"),
    ]
    model = _model(nodes)
    model.graph.initializer.extend([numpy_helper.from_array(a, name) for name, a in (("w", w), ("w2", w2), ("big", big))])
    return model


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_command_writes_and_reports_what_the_api_converts(tmp_path, dtype):
    """Constants lowered (flushed, clipped with --clip-initializers): the
    CLI writes what the API writes, and reports the same."""
    path = _save(tmp_path, _with_constants())
    for clip in ([], ["--clip-initializers"]):
        out, report = tmp_path / f"out{len(clip)}.onnx", tmp_path / f"report{len(clip)}.json"
        proc = cli(path, "-o", out, "--no-validate", "--dtype", dtype, "--report", report, *clip)
        assert proc.returncode == 0, proc.stderr
        expected = convert(str(path), level="O2", dtype=dtype, clip_initializers=bool(clip))
        assert onnx.load(str(out)) == expected.model
        written = json.loads(report.read_text())
        rewrite = written["conversion"]["rewrite"]
        assert rewrite["flushed"] == expected.stats.flushed and rewrite["clipped"] == expected.stats.clipped
        assert rewrite["flushed"] == ({"w": 1, "shift": 1} if dtype == "fp16" else {})
        assert rewrite["clipped"] == ({"big": 1} if clip and dtype == "fp16" else {})
        assert written["plan"]["counts"] == expected.plan.counts()


def test_lowering_reports_constants_in_graph_order(tmp_path):
    """With the initializer range rule off the planner gathers no constant
    facts: the rewrite gathers them, and the report's flushed counts come
    in the graph's order, from the command as from the API."""
    rng = np.random.default_rng(7)
    small, large = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 70000)).astype(np.float32)
    small[0, 0] = large[0, 0] = 1e-9
    nodes = [
        helper.make_node("MatMul", ["x", "s"], ["h"], name="mm"),
        helper.make_node("MatMul", ["h", "l"], ["y"], name="mm_large"),
    ]
    built = _model(nodes)
    built.graph.initializer.extend([numpy_helper.from_array(small, "s"), numpy_helper.from_array(large, "l")])
    built.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 70000
    path = _save(tmp_path, built)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    proc = cli(path, "-o", out, "--no-validate", "--no-initializer-range", "--report", report)
    assert proc.returncode == 0, proc.stderr
    expected = convert(str(path), level="O2", initializer_range=False)
    flushed = json.loads(report.read_text())["conversion"]["rewrite"]["flushed"]
    assert list(flushed.items()) == list(expected.stats.flushed.items()) == [("s", 1), ("l", 1)]
    assert onnx.load(str(out)) == expected.model


def test_input_with_a_name_that_is_not_utf8_is_refused(tmp_path):
    data = _model([helper.make_node("Relu", ["x"], ["y"], name="NODE")]).SerializeToString()
    path = _write(tmp_path, data.replace(b"NODE", b"N\xff\xfeE"))
    out = tmp_path / "out.onnx"
    before = snapshot(tmp_path)
    assert_refused(cli(path, "-o", out, "--no-validate"), "not valid UTF-8", before, tmp_path)


# ---------------------------------------------------- options and config


OPTION_ERRORS = {
    "op-type-with-hint": (["--black-list", "softmax"], "did you mean 'Softmax'"),
    "only-black-list-op": (["--only-black-list", "NotAnOp"], "unknown ONNX op type 'NotAnOp'"),
    "config-level": (["--config", "{tmp}/c.toml"], "--level", 'level = "O9"\n'),
    "config-op-type": (["--config", "{tmp}/c.toml"], "unknown ONNX op type 'Convv'", 'white-list = ["Convv"]\n'),
    "config-dtype": (["--config", "{tmp}/c.toml"], "--dtype", 'dtype = "int8"\n'),
    "config-not-utf8": (["--config", "{tmp}/c.toml"], "malformed TOML", b"\xff\xfe level"),
    "config-is-a-folder": (["--config", "{tmp}"], "--config"),
    "atol-nan": (["--atol", "nan"], "--atol"),
    "rtol-negative": (["--rtol", "-1"], "--rtol"),
    "min-cosine-above-1": (["--min-cosine", "2"], "--min-cosine"),
    # NaN passes every range check (click's FloatRange too); infinity checks nothing, and is no JSON number
    "min-cosine-nan": (["--min-cosine", "nan"], "'--min-cosine': 'nan': expected a finite number in [-1, 1]"),
    "config-min-cosine-nan": (["--config", "{tmp}/c.toml"], "expected a finite number in [-1, 1]", "min_cosine = nan\n"),
    "rtol-nan": (["--rtol", "nan"], "'--rtol': 'nan': expected a finite number >= 0"),
    "data-max-nan": (["--data-max", "nan"], "'--data-max': 'nan': expected a finite number > 0"),
    "data-max-infinite": (["--data-max", "inf"], "'--data-max': 'inf': expected a finite number > 0"),
    "config-data-max-infinite": (["--config", "{tmp}/c.toml"], "expected a finite number > 0", "data-max = inf\n"),
    "top-negative": (["--top", "-1"], "--top"),
    "input-range-infinite": (["--input-range", "input=-inf:inf"], "finite LOW < HIGH"),
    "input-range-beyond-float32": (["--input-range", "input=-1e39:1e39"], "beyond float32's range"),
    "polygraphy-empty-array": (["--inputs", "{tmp}/in.json"], "not a Polygraphy-encoded array", None),
    "config-key-beside-the-table": (
        ["--config", "{tmp}/c.toml"],
        "'level' is outside the [amp-convert] table",
        'level = "O1"\n[amp-convert]\ndtype = "bf16"\n',
    ),
    "config-table-beside-the-table": (
        ["--config", "{tmp}/c.toml"],
        "'tool' is outside the [amp-convert] table",
        '[amp-convert]\nlevel = "O1"\n[tool]\nx = 1\n',
    ),
    "config-integer-given-a-float": (["--config", "{tmp}/c.toml"], "samples must be an integer, got 1.5", "samples = 1.5\n"),
    "config-number-given-a-bool": (["--config", "{tmp}/c.toml"], "atol must be a number, got True", "atol = true\n"),
    "config-nested-too-deeply": (["--config", "{tmp}/c.toml"], "nested too deeply", "a = " + "[" * 50_000 + "]" * 50_000),
    "config-unreadable": (["--config", "{tmp}/" + "c" * 300], "cannot be read (File name too long)"),
    "seed-negative": (["--seed", "-1"], "--seed"),
    "target-opset-below-the-models": (["--target-opset", "12"], "--target-opset 12 is below the model's opset 17"),
    "target-opset-zero": (["--target-opset", "0"], "--target-opset must be a positive integer"),
}


def test_a_target_opset_onnxruntime_cannot_load_is_refused_before_converting(tmp_path, lstm):
    """Validation runs the model at --target-opset: where onnxruntime loads
    no model at that opset (or its IR version), the run is refused as a
    usage error; it read as the conversion's failure (exit 3, blaming
    onnxruntime's graph optimizations)."""
    import onnx
    import onnxruntime

    from amp_convert.ortversions import min_ir_for_opset, version_refusal

    newest = onnx.defs.onnx_opset_version()
    if version_refusal(newest, min_ir_for_opset(newest)) is None:
        pytest.skip(f"onnxruntime {onnxruntime.__version__} loads opset {newest}, the newest onnx knows")
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", out, "--target-opset", str(newest)), f"--target-opset {newest}: onnxruntime", before, tmp_path)


def _config_case(tmp_path: Path, case: tuple) -> list[str]:
    args = case[0]
    if len(case) > 2 and case[2] is None:  # a Polygraphy input file whose array is empty
        (tmp_path / "in.json").write_text('[{"input": {"array": "", "polygraphy_class": "ndarray"}}]')
    elif len(case) > 2:
        content = case[2]
        config = tmp_path / "c.toml"
        config.write_bytes(content if isinstance(content, bytes) else content.encode())
    return [a.format(tmp=tmp_path) for a in args]


@pytest.mark.parametrize("case", sorted(OPTION_ERRORS))
def test_bad_option_or_config_exits_2(tmp_path, lstm, case):
    args = _config_case(tmp_path, OPTION_ERRORS[case])
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", out, *args), OPTION_ERRORS[case][1], before, tmp_path)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _huge_npy() -> bytes:
    """An .npy header declaring a petabyte of float32, followed by 64 bytes."""
    buffer = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": (1, 20, 16 * 10**12)}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + bytes(64)


def _zip(tmp: Path, members: dict[str, bytes], name: str = "x.npz") -> None:
    with zipfile.ZipFile(tmp / name, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)


def _polygraphy(tmp: Path, data: bytes) -> None:
    encoded = base64.b64encode(data).decode()
    (tmp / "in.json").write_text(json.dumps([{"input": {"array": encoded, "polygraphy_class": "ndarray"}}]))


# Validation and calibration input files (lstm's input: float32 [1, 20, 16]).
INPUT_FILE_ERRORS = {
    "npy-named-npz": (
        lambda tmp: _write(tmp, _npy_bytes(np.zeros((1, 20, 16), np.float32)), "x.npz"),
        ["--inputs", "{tmp}/x.npz"],
        "x.npz: is not an .npz (zip) archive (it is a single .npy array)",
    ),
    "text-named-npz": (
        lambda tmp: _write(tmp, b"input,1.0\n", "x.npz"),
        ["--inputs", "{tmp}/x.npz"],
        "x.npz: is not an .npz (zip) archive; save inputs with np.savez",
    ),
    "npz-member-not-npy-data": (
        lambda tmp: _zip(tmp, {"input.npy": b"hello world"}),
        ["--inputs", "{tmp}/x.npz"],
        "member 'input.npy' is not an .npy array",
    ),
    "npz-member-not-npy-name": (
        lambda tmp: _zip(tmp, {"notes.txt": b"hello world"}),
        ["--inputs", "{tmp}/x.npz"],
        "member 'notes.txt' is not an .npy array",
    ),
    "npz-member-huge-shape": (
        lambda tmp: _zip(tmp, {"input.npy": _huge_npy()}),
        ["--inputs", "{tmp}/x.npz"],
        "member 'input.npy' declares shape [1, 20, 16000000000000] of float32",
    ),
    "polygraphy-huge-shape": (
        lambda tmp: _polygraphy(tmp, _huge_npy()),
        ["--inputs", "{tmp}/in.json"],
        "input 'input' declares shape [1, 20, 16000000000000]",
    ),
    "polygraphy-nested-too-deeply": (
        lambda tmp: _write(tmp, b"[" * 100_000 + b"]" * 100_000, "in.json"),
        ["--inputs", "{tmp}/in.json"],
        "in.json: JSON nested too deeply",
    ),
    "calibration-file-names-its-flag": (
        lambda tmp: _write(tmp, b"input,1.0\n", "x.npz"),
        ["--calibration", "{tmp}/x.npz"],
        "error: --calibration {tmp}/x.npz: is not an .npz (zip) archive",
    ),
    "calibration-without-samples": (  # (the calibrated rule would be off without a word)
        lambda tmp: _write(tmp, b"[]", "in.json"),
        ["--calibration", "{tmp}/in.json", "--no-validate"],
        "error: no calibration samples in --calibration {tmp}/in.json",
    ),
    "calibration-without-samples-beside-validation": (
        lambda tmp: _write(tmp, b"[]", "in.json"),
        ["--calibration", "{tmp}/in.json"],
        "error: no calibration samples in --calibration {tmp}/in.json",
    ),
    "inputs-without-samples": (  # (calibrated from them at O2: refused before anything is converted)
        lambda tmp: _write(tmp, b"[]", "in.json"),
        ["--inputs", "{tmp}/in.json"],
        "error: no validation samples in --inputs {tmp}/in.json",
    ),
    "inputs-without-samples-at-o3": (  # (no calibration: refused by validation)
        lambda tmp: _write(tmp, b"[]", "in.json"),
        ["--inputs", "{tmp}/in.json", "--level", "O3"],
        "error: no validation samples in --inputs {tmp}/in.json",
    ),
    "calibration-folder-names-its-flag": (
        lambda tmp: (tmp / "calib").mkdir(),
        ["--calibration", "{tmp}/calib"],
        "error: --calibration {tmp}/calib: the folder holds no .npz files",
    ),
}


@pytest.mark.parametrize("case", sorted(INPUT_FILE_ERRORS))
def test_bad_validation_input_file_exits_2(tmp_path, lstm, case):
    build, args, fragment = INPUT_FILE_ERRORS[case]
    build(tmp_path)
    _assert_refuses(tmp_path, lstm, args, fragment)


def _assert_refuses(tmp_path, model, args: list[str], fragment: str) -> None:
    """The command on ``model`` with ``args`` ({tmp}: ``tmp_path``) exits 2
    saying ``fragment``, and leaves the files there (an old -o among them)
    as they were."""
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    proc = cli(model, "-o", out, *[a.format(tmp=tmp_path) for a in args])
    assert_refused(proc, fragment.format(tmp=tmp_path), before, tmp_path)


@pytest.mark.parametrize(
    ("name", "data", "fragment"),
    [
        ("in.json", b"[]", "no calibration samples in --calibration {tmp}/in.json"),
        ("in.npz", None, "--calibration {tmp}/in.npz: missing input 'x'"),  # (np.savez with no arrays)
    ],
)
@pytest.mark.parametrize("validate", ["--validate", "--no-validate"])
def test_calibration_without_a_sample_is_refused_before_any_session(tmp_path, name, data, fragment, validate):
    """The model has an op onnxruntime does not know: a session of it fails.
    --calibration files holding no sample (or a first sample without the
    model's input) are refused before the calibration session is built, not
    after (the message is theirs, not onnxruntime's)."""
    custom = helper.make_node("Frobnicate", ["r"], ["y"], domain="example.custom")
    m = _model([helper.make_node("Relu", ["x"], ["r"]), custom])
    m.opset_import.append(helper.make_opsetid("example.custom", 1))
    path = _save(tmp_path, m)
    if data is None:
        np.savez(tmp_path / name)
    else:
        _write(tmp_path, data, name)
    before = snapshot(tmp_path)
    proc = cli(path, "-o", tmp_path / "out.onnx", validate, "--calibration", tmp_path / name)
    assert_refused(proc, fragment.format(tmp=tmp_path), before, tmp_path)


UNREAD_SAMPLE_OPTIONS = {
    "calibration-missing-at-o3": (["--level", "O3", "--calibration", "{tmp}/no.npz"], "--calibration {tmp}/no.npz: no such file"),
    "calibration-missing-without-safety": (
        ["--no-safety", "--calibration", "{tmp}/no.npz"],
        "--calibration {tmp}/no.npz: no such file",
    ),
    "inputs-missing-without-validation": (["--no-validate", "--inputs", "{tmp}/no.npz"], "--inputs {tmp}/no.npz: no such file"),
    "input-shape-unknown-without-validation": (
        ["--no-validate", "--input-shape", "bogus=1x2"],
        "--input-shape: 'bogus' is not an input of the model",
    ),
    "input-range-unknown-without-validation": (
        ["--no-validate", "--input-range", "bogus=0:1"],
        "--input-range: 'bogus' is not an input of the model",
    ),
    "input-range-unknown-with-unread-calibration": (
        ["--no-validate", "--level", "O3", "--calibration", "{tmp}/c.npz", "--input-range", "bogus=0:1"],
        "--input-range: 'bogus' is not an input of the model",
    ),
}


@pytest.mark.parametrize("case", sorted(UNREAD_SAMPLE_OPTIONS))
def test_sample_options_the_run_does_not_read_are_vetted_all_the_same(tmp_path, lstm, case):
    """A missing file or an unknown input name is a mistake whether or not
    the run reads it (--no-validate; --calibration with the safety rules off)."""
    args, fragment = UNREAD_SAMPLE_OPTIONS[case]
    np.savez(tmp_path / "c.npz", input=np.zeros((1, 20, 16), np.float32))
    _assert_refuses(tmp_path, lstm, args, fragment)


@pytest.mark.parametrize(
    ("args", "why"), [(["--level", "O3"], "at O3; `safety` turns them on"), (["--no-safety"], "`safety` false")]
)
def test_a_calibration_file_the_run_does_not_read_is_said_so(tmp_path, lstm, args, why):
    """At O3 (or with --no-safety) the safety rules, which read --calibration,
    are off: the file is vetted, and the plan says it went unread."""
    np.savez(tmp_path / "c.npz", input=np.zeros((1, 20, 16), np.float32))
    plan = tmp_path / "plan.json"
    proc = cli(
        lstm, "-o", tmp_path / "out.onnx", "--no-validate", "--calibration", tmp_path / "c.npz", "--plan-json", plan, *args
    )
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(plan.read_text())["notes"]
    assert f"`calibration` not read: the safety rules, which use it, are off ({why})" in notes  # (the plan JSON names fields)


def test_generated_input_too_large_is_refused_before_allocating(tmp_path):
    x = helper.make_tensor_value_info("x", F32, ["batch", 4])
    y = helper.make_tensor_value_info("y", F32, ["batch", 4])
    path = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    before = snapshot(tmp_path)
    proc = cli(path, "-o", tmp_path / "out.onnx", "--input-shape", "x=100000000000x4")
    assert_refused(proc, "input 'x': a generated sample of shape [100000000000, 4]", before, tmp_path)


@pytest.mark.parametrize("data_max", [math.inf, math.nan, 0.0])
def test_a_data_max_that_checks_nothing_is_refused_through_the_api(data_max):
    with pytest.raises(AmpError, match="`data_max` must be a finite number > 0"):
        ConvertOptions(data_max=data_max).validated()


def test_negative_seed_is_refused_through_the_api():
    with pytest.raises(AmpError, match="`seed` must be 0 or more"):
        make_source(onnx.load(str(ZOO / "lstm.onnx")), seed=-1)


def test_the_sample_options_are_named_as_fields_by_the_api_and_as_flags_by_the_cli(tmp_path):
    """The library names the option's field; the command line spells the same message with its flag."""
    model = onnx.load(str(ZOO / "lstm.onnx"))
    with pytest.raises(AmpError, match=r"^`samples` must be at least 1$"):
        make_source(model, samples=0)
    with pytest.raises(AmpError, match=r"^`input_shape` 'x': expected NAME=1x3x224x224$"):
        make_source(model, shapes=["x"])
    with pytest.raises(AmpError, match=r"^`inputs` .*no\.npz: no such file or folder$"):
        make_source(model, inputs=[tmp_path / "no.npz"])
    proc = cli(ZOO / "lstm.onnx", "-o", tmp_path / "o.onnx", "--input-shape", "x")
    assert proc.returncode == 2 and proc.stderr == "amp-convert: error: --input-shape 'x': expected NAME=1x3x224x224\n"


OUTPUT_FLAG_ERRORS = {
    "o-ending-in-a-separator": (["-o", "{tmp}/newdir/"], "'-o' / '--output': {tmp}/newdir/: names a directory"),
    "report-ending-in-a-separator": (["--report", "{tmp}/r/"], "'--report': {tmp}/r/: names a directory"),
    "report-in-a-missing-folder": (["--report", "{tmp}/missing/r.json"], "--report {tmp}/missing/r.json: folder"),
    "html-is-a-folder": (["--html", "{tmp}"], "--html {tmp}: is a directory"),
    "plan-json-is-the-input": (["--plan-json", "{tmp}/lstm.onnx"], "choose another --plan-json"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_FLAG_ERRORS))
def test_bad_output_path_names_its_option(tmp_path, lstm, case):
    args, fragment = OUTPUT_FLAG_ERRORS[case]
    before = snapshot(tmp_path)
    proc = cli(lstm, *[a.format(tmp=tmp_path) for a in args])
    assert_refused(proc, fragment.format(tmp=tmp_path), before, tmp_path)


@pytest.mark.parametrize("value", ["0.2:0.9", "0:1e30"])
def test_integer_input_range_holding_no_valid_value_exits_2(tmp_path, value):
    """[0.2, 0.9) holds no integer; 1e30 is beyond int64."""
    out = tmp_path / "out.onnx"
    proc = cli(ZOO / "bert.onnx", "-o", out, "--input-range", f"input_ids={value}", "-q")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--input-range input_ids=" in proc.stderr and not out.exists()


def test_sequence_input_is_refused_for_validation_and_converts_without_it(tmp_path):
    seq = onnx.helper.make_tensor_sequence_value_info("s", onnx.TensorProto.FLOAT, [2])
    nodes = [
        onnx.helper.make_node("SequenceAt", ["s", "zero"], ["t"], name="at"),
        onnx.helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    path = _save(tmp_path, _model(nodes, [seq], [y], initializers=[zero]))
    out = tmp_path / "out.onnx"
    before = snapshot(tmp_path)
    assert_refused(cli(path, "-o", out), "is not a tensor", before, tmp_path)
    proc = cli(path, "-o", out, "--no-validate", "-q")
    assert proc.returncode == 0, proc.stderr


CONFIG_BUGS = {
    "list-not-a-list": ("white-list = 3\n", "white-list"),
    "table-not-a-table": ("amp-convert = 3\n", "amp-convert"),
    "bool-not-a-bool": ("safety = 3\n", "safety"),
    "flag-not-a-bool": ("explain = 1\n", "explain must be true or false"),
    "report-path-a-number": ("report = 5\n", "report must be a string"),
    "html-path-a-bool": ("html = true\n", "html must be a string"),
    "plan-path-a-number": ("plan-json = 1.5\n", "plan-json must be a string"),
    "output-a-number": ("output = 3\n", "output must be a string"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_BUGS))
def test_config_values_of_the_wrong_type_exit_2(tmp_path, lstm, case):
    content, fragment = CONFIG_BUGS[case]
    (tmp_path / "c.toml").write_text(content)
    out = tmp_path / "out.onnx"
    out.write_bytes(OLD)
    before = snapshot(tmp_path)
    assert_refused(cli(lstm, "-o", out, "--config", tmp_path / "c.toml"), fragment, before, tmp_path)


def test_config_lists_profile_is_applied(tmp_path, lstm):
    (tmp_path / "c.toml").write_text('lists = "paddle"\n')
    plan = tmp_path / "plan.json"
    proc = cli(lstm, "-o", tmp_path / "out.onnx", "--config", tmp_path / "c.toml", "--plan-json", plan, "-q")
    assert proc.returncode in (0, 1), proc.stderr
    assert '"profile": "paddle"' in plan.read_text()


# ---------------------------------------------------------- atomic writes


def test_save_failure_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "out.onnx"
    target.write_bytes(OLD)

    def failing_save(proto, f, *args, **kwargs):
        Path(f).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(amp_save, "write_model_file", failing_save)
    with pytest.raises(AmpError, match="No space left on device"):
        save_model(onnx.load(str(ZOO / "lstm.onnx")), target)
    assert target.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


@pytest.mark.parametrize("external", [False, True], ids=["one-file", "external-data"])
def test_work_done_while_the_output_is_flushed_sees_it_written_and_not_yet_in_place(tmp_path, external):
    """``meanwhile`` (the CLI makes its report there) runs once the model is
    written and before it replaces anything; when it raises, the old file
    stays and no temporary is left."""
    from amp_convert.external import payload

    model = onnx.load(str(ZOO / "lstm.onnx"))
    target = tmp_path / "out.onnx"
    target.write_bytes(OLD)
    measured = payload(model, may_be_external=False)
    seen: list[tuple[bytes, list[bytes]]] = []

    def look() -> None:
        # (the model written: a temporary file beside the target, or out.onnx in a staging folder)
        written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != target and p.suffix != ".data"]
        seen.append((target.read_bytes(), written))

    save_model(model, target, external=external, measured=None if external else measured, meanwhile=look)
    ((old, written),) = seen
    assert old == OLD and len(written) == 1 and target.read_bytes() == written[0]  # (in place after, not before)
    if not external:
        assert written[0] == measured.serialized

    def failing() -> None:
        raise RuntimeError("the report could not be made")

    target.write_bytes(OLD)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}  # (with the data file the first write left)
    with pytest.raises(RuntimeError, match="could not be made"):  # (a fresh model: writing external data moves its tensors)
        save_model(onnx.load(str(ZOO / "lstm.onnx")), target, external=external, meanwhile=failing)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("external", [[], ["--external-data", "always"]], ids=["one-file", "external-data"])
def test_the_report_gives_the_size_written(tmp_path, external):
    """The report of a one-file output is made while the file is flushed,
    from the bytes written: its size after is the files' size all the same."""
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    proc = cli(ZOO / "lstm.onnx", "-o", out, "--no-validate", "--report", report, *external)
    assert proc.returncode == 0, proc.stderr
    files = sum(p.stat().st_size for p in tmp_path.glob("out.onnx*"))
    assert (tmp_path / "out.onnx.data").exists() == bool(external)
    assert json.loads(report.read_text())["size"]["after_bytes"] == files


def test_outputs_get_ordinary_permissions_and_signal_handlers_are_restored(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    model = onnx.load(str(ZOO / "lstm.onnx"))
    save_model(model, tmp_path / "new.onnx")
    assert stat.S_IMODE((tmp_path / "new.onnx").stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    existing.chmod(0o640)
    with TextFiles() as files:
        files.write(existing, '{"a": 1}')
        files.place()
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640 and existing.read_text() == '{"a": 1}'
    assert {s: signal.getsignal(s) for s in handlers} == handlers


# Run in a child process: the model writer writes half the model, says so, then sleeps
# until a signal arrives, so the signal always lands mid-write.
SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    import amp_convert.saving

    def slow_save(proto, f, *args, **kwargs):
        data = proto.SerializeToString()
        with open(f, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
        open(sys.argv[1], "w").close()
        time.sleep(120)
        with open(f, "ab") as out:
            out.write(data[len(data) // 2 :])

    amp_convert.saving.write_model_file = slow_save
    from amp_convert.cli import main

    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    """A 16 MB fp32 model (four 1024x1024 MatMuls) with static shapes."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(4):
        inits.append(numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [1, 1024])],
        [helper.make_tensor_value_info(x, F32, [1, 1024])],
        initializers=inits,
    )
    path = tmp_path_factory.mktemp("big") / "big.onnx"
    onnx.save(model, str(path))
    return path


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def _start_slow_writer(tmp_path: Path, model: Path, target: Path) -> tuple[subprocess.Popen, Path]:
    driver = tmp_path / "driver.py"
    driver.write_text(SLOW_WRITER)
    marker = tmp_path / "writing"
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(marker), str(model), "-o", str(target), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the converter exited ({proc.returncode}) before writing: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the converter did not start writing within 240 s")
        time.sleep(0.05)
    return proc, marker


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_interrupt_mid_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, big_model, signum):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "big.fp16.onnx"
    target.write_bytes(OLD)
    proc, _ = _start_slow_writer(tmp_path, big_model, target)
    assert len(_temporaries(out_dir)) == 1  # caught mid-write: half the model is in the temporary file
    assert target.read_bytes() == OLD
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    ours = [line for line in stderr.splitlines() if line.startswith("amp-convert")]
    assert ours == ["amp-convert: interrupted"] and stderr.strip().endswith(ours[0])
    assert target.read_bytes() == OLD
    assert _temporaries(out_dir) == []


SLOW_STAGE_WRITERS = textwrap.dedent(
    """
    import sys, time
    import amp_convert.saving

    marker, which = sys.argv[1], sys.argv[2]
    write_external = amp_convert.saving.write_with_external_data

    def slow_external(*args, **kwargs):
        write_external(*args, **kwargs)  # the model and its data file, complete, in the staging folder
        open(marker, "w").close()
        time.sleep(120)

    write_report = amp_convert.saving.TextFiles.write

    def slow_text(self, path, text):
        write_report(self, path, text[: len(text) // 2])  # half the report, beside its target
        open(marker, "w").close()
        time.sleep(120)

    if which == "external":
        amp_convert.saving.write_with_external_data = slow_external
    else:
        amp_convert.saving.TextFiles.write = slow_text
    from amp_convert.cli import main

    sys.exit(main(sys.argv[3:]))
    """
)


@pytest.mark.parametrize("which", ["external", "report"])
def test_interrupt_mid_write_of_external_data_or_a_report_keeps_the_old_files(tmp_path, big_model, which):
    """The model with its data file (written in a staging folder, renamed
    together) and the reports are as safe from SIGTERM as the model alone."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "big.fp16.onnx"
    olds = {target: OLD, out_dir / "big.fp16.onnx.data": OLD + b"data", out_dir / "r.json": OLD + b"report"}
    for path, data in olds.items():
        path.write_bytes(data)
    driver, marker = tmp_path / "driver.py", tmp_path / "writing"
    driver.write_text(SLOW_STAGE_WRITERS)
    args = [str(big_model), "-o", str(target), "-q", "--no-validate"]
    args += ["--external-data", "always"] if which == "external" else ["--report", str(out_dir / "r.json")]
    proc = subprocess.Popen([sys.executable, str(driver), str(marker), which, *args], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the converter did not start writing within 240 s"
        time.sleep(0.05)
    assert sorted(p.name for p in out_dir.iterdir() if p.name.endswith(".tmp"))  # caught mid-write
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "amp-convert: interrupted" in stderr and "Traceback" not in stderr
    assert all(path.read_bytes() == data for path, data in olds.items())  # (the model is put in place after its reports)
    assert [p.name for p in out_dir.iterdir() if p.name.endswith(".tmp")] == []


SLOW_SESSION = textwrap.dedent(
    """
    import sys, time
    import amp_convert.runner

    marker = sys.argv[1]
    write_external = amp_convert.runner.write_with_external_data

    def slow_copy(*args, **kwargs):
        write_external(*args, **kwargs)  # the model's copy for onnxruntime, complete, in the scratch folder
        open(marker, "w").close()
        time.sleep(120)

    amp_convert.runner.write_with_external_data = slow_copy
    from amp_convert.cli import main

    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_interrupt_while_validation_copies_an_external_data_model_leaves_no_copy(tmp_path, signum):
    """onnxruntime reads a model with external data only from files: for
    validation it is copied to a scratch folder, as large as the model.
    SIGTERM and SIGHUP kill Python without clean-up: the copy stayed."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    src = tmp_path / "m.onnx"
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.eye(64, dtype=np.float32), "W")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(m, str(src), save_as_external_data=True, location="m.data", size_threshold=0)
    driver, marker = tmp_path / "driver.py", tmp_path / "copied"
    driver.write_text(SLOW_SESSION)
    args = [str(src), "-o", str(tmp_path / "out.onnx"), "-q"]
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, str(driver), str(marker), *args], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "validation did not copy the model within 240 s"
        time.sleep(0.05)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("amp-convert-")]  # caught with the copy made
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "amp-convert: interrupted" in stderr and "Traceback" not in stderr
    assert [p.name for p in scratch.iterdir() if p.name.startswith("amp-convert-")] == []
    assert not (tmp_path / "out.onnx").exists()


def test_sigkill_mid_write_still_never_leaves_a_partial_target(tmp_path, big_model):
    """SIGKILL cannot be caught: the temporary file stays behind, the target is intact."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "big.fp16.onnx"
    target.write_bytes(OLD)
    proc, _ = _start_slow_writer(tmp_path, big_model, target)
    proc.kill()
    proc.communicate(timeout=60)
    assert target.read_bytes() == OLD
    assert len(_temporaries(out_dir)) == 1


def test_sigterm_during_a_real_write_leaves_the_old_file_or_the_whole_new_one(tmp_path, big_model):
    """No patching: SIGTERM as soon as the temporary file appears. Whatever
    the timing, the target is the old file or the complete new model."""
    target = tmp_path / "big.fp16.onnx"
    target.write_bytes(OLD)
    proc = subprocess.Popen(
        [str(EXE), str(big_model), "-o", str(target), "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while proc.poll() is None and not _temporaries(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr
    assert _temporaries(tmp_path) == []
    if target.read_bytes() != OLD:  # the signal came after the rename
        assert proc.returncode in (0, 130, -signal.SIGTERM), stderr
        onnx.checker.check_model(onnx.load(str(target)), full_check=True)
    else:
        assert proc.returncode == 130, stderr


# ------------------------------------------------------------ determinism

DETERMINISM_DRIVER = textwrap.dedent(
    """
    import sys
    from amp_convert import convert
    from amp_convert.saving import save_model

    zoo, out = sys.argv[1], sys.argv[2]
    for name in ("resnet50", "bert", "controlflow"):
        for level in ("O1", "O2", "O3"):
            for dtype in ("fp16", "bf16"):
                result = convert(f"{zoo}/{name}.onnx", level=level, dtype=dtype)
                save_model(result.model, f"{out}/{name}.{level}.{dtype}.onnx")
    """
)


def test_same_input_and_options_give_byte_identical_files_across_processes(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DETERMINISM_DRIVER)
    outputs = []
    for hash_seed in ("1", "2"):  # a set iterated in hash order would show up here
        out = tmp_path / f"run{hash_seed}"
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([sys.executable, str(driver), str(ZOO), str(out)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert len(outputs[0]) == 18
    assert outputs[0] == outputs[1]


def test_console_script_output_is_byte_identical_across_runs(tmp_path, lstm):
    for name in ("a.onnx", "b.onnx"):
        proc = cli(lstm, "--level", "O2", "-o", tmp_path / name, "-q")
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


# ------------------------------------------------------------- idempotence

ZOO_ENTRIES = {e["name"]: e for e in load_manifest(str(ZOO / "manifest.json"))}


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("name", sorted(ZOO_ENTRIES))
def test_converting_a_converted_model_again_changes_nothing(name, level):
    entry = ZOO_ENTRIES[name]
    once = convert(entry["path"], level=level, dtype="fp16").model
    twice = convert(once, level=level, dtype="fp16").model
    assert count_casts(twice) == count_casts(once)
    assert len(twice.graph.node) == len(once.graph.node)
    feeds = make_inputs(entry, seed=0)
    for a, b in zip(run(once, feeds), run(twice, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()  # bitwise


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_converting_again_in_bf16_adds_no_casts(level):
    for name, entry in sorted(ZOO_ENTRIES.items()):
        once = convert(entry["path"], level=level, dtype="bf16").model
        twice = convert(once, level=level, dtype="bf16").model
        assert count_casts(twice) == count_casts(once), name


def test_the_check_of_a_written_file_checks_types_as_onnx_full_check_does(tmp_path):
    """A model that strict shape inference passes but whose op reads a type
    its schema does not allow (RandomNormalLike has no bfloat16 input) fails
    the written file's full check, as ``check_model(full_check=True)`` does:
    the CLI checks files, and must not write what the API would refuse."""
    from amp_convert.check import check_file
    from amp_convert.errors import ConversionError

    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["y"], dtype=TensorProto.FLOAT)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.shape_inference.infer_shapes(m, strict_mode=True)  # (passes without the type check)
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(m, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    check_file(path, "basic")
    with pytest.raises(ConversionError, match=r"fails the ONNX checker.*RandomNormalLike"):
        check_file(path, "full")


@pytest.mark.parametrize("validate", [True, False])
def test_an_input_failing_strict_shape_inference_is_blamed_and_nothing_is_written(tmp_path, validate):
    """The basic checker passes it; its declared output shape contradicts
    inference. The CLI checks the written file, which fails: the input is
    checked in full then, blamed (exit 2), and neither the model nor the
    plan asked for is written."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="r")]
    weights = [numpy_helper.from_array(np.ones((4, 4), np.float32), "W")]
    m = _model(nodes, outputs=[helper.make_tensor_value_info("y", F32, [2, 5])], initializers=weights)
    onnx.checker.check_model(m)
    path = _save(tmp_path, m)
    before = snapshot(tmp_path)
    proc = cli(path, "-o", tmp_path / "out.onnx", "--plan-json", tmp_path / "plan.json", *([] if validate else ["--no-validate"]))
    assert_refused(proc, "the input model fails ONNX shape inference", before, tmp_path)


def test_a_model_that_cannot_be_written_leaves_no_plan_behind(tmp_path):
    """The plan is written once the model is in place: the output's data
    file name is taken by a folder, so nothing is written at all."""
    path = external_model(tmp_path / "in")
    (tmp_path / "out.onnx.data").mkdir()
    before = snapshot(tmp_path)
    proc = cli(path, "-o", tmp_path / "out.onnx", "--plan-json", tmp_path / "plan.json", "--no-validate")
    assert_refused(proc, "out.onnx.data", before, tmp_path)


@pytest.mark.parametrize("flag", ["-o", "--report", "--plan-json", "--inputs", "data file"])
def test_a_file_name_too_long_for_the_system_exits_2_naming_it(tmp_path, lstm, flag):
    """Each path option given a name longer than the file system allows
    (the data file's: the model's name with .data added), one line and
    nothing written, where it was an internal error (exit 3)."""
    long = "a" * 300
    args = {"-o": ["-o", tmp_path / f"{long}.onnx"], "--inputs": ["--inputs", tmp_path / f"{long}.npz"]}.get(flag)
    if flag == "data file":  # (a legal model name, 256 characters with .data)
        args = ["-o", tmp_path / f"{'b' * 246}.onnx", "--external-data", "always", "--no-validate"]
    elif args is None:
        args = [flag, tmp_path / f"{long}.json"]
    out = [] if "-o" in args else ["-o", tmp_path / "out.onnx"]
    before = snapshot(tmp_path)
    line = assert_refused(cli(lstm, *out, *args), "File name too long", before, tmp_path)
    assert "internal error" not in line


@pytest.mark.parametrize(
    "case",
    ["report over samples", "plan over calibration", "model over config", "html over a sample in a folder", "compare report"],
)
def test_no_output_replaces_an_input_of_another_kind(tmp_path, lstm, case):
    """Samples, calibration data and the config are inputs too: an output
    given one of their names is refused like one over the model (exit 2,
    nothing written), and compare's --report and --html need two files."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.move(lstm, work / "lstm.onnx")
    model_path = work / "lstm.onnx"
    feeds = {"input": np.zeros((1, 20, 16), np.float32)}  # (the zoo LSTM's one input)
    np.savez(work / "s.npz", **feeds)
    (work / "samples").mkdir()
    np.savez(work / "samples" / "a.npz", **feeds)
    (work / "amp.toml").write_text('level = "O2"\n')
    out = ["-o", work / "out.onnx"]
    args = {
        "report over samples": [*out, "--inputs", work / "s.npz", "--report", work / "s.npz"],
        "plan over calibration": [*out, "--calibration", work / "s.npz", "--plan-json", work / "s.npz"],
        "model over config": ["-o", work / "amp.toml", "--config", work / "amp.toml"],
        "html over a sample in a folder": [*out, "--inputs", work / "samples", "--html", work / "samples" / "a.npz"],
        "compare report": ["--report", work / "r.json", "--html", work / "r.json"],
    }[case]
    before = snapshot(work)
    proc = cli("compare", model_path, model_path, *args) if case == "compare report" else cli(model_path, *args)
    assert_refused(proc, "given as both" if case == "compare report" else "is one of the inputs", before, work)


@pytest.mark.parametrize("failing", ["--report", "--html", "--plan-json"])
@pytest.mark.parametrize("external", [False, True])
def test_a_report_that_cannot_be_written_leaves_the_model_and_the_other_files_as_they_were(tmp_path, lstm, failing, external):
    """Every file asked for is written beside its target first and put in
    place with the model: one that cannot be written (here it fails as on a
    full disk) makes the command exit 2 with the model and the others old."""
    out = tmp_path / "out"
    out.mkdir()
    files = {"-o": out / "m.onnx", "--report": out / "r.json", "--html": out / "r.html", "--plan-json": out / "p.json"}
    for path in files.values():
        path.write_bytes(b"old")
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            import shutil, sys
            from pathlib import Path
            import amp_convert.saving
            from amp_convert.cli import main

            write = amp_convert.saving.TextFiles.write

            def failing(self, target, text):
                if Path(target).name == {files[failing].name!r}:
                    raise amp_convert.saving.AmpError(f"{{target}}: cannot write (No space left on device); nothing was written")
                write(self, target, text)

            amp_convert.saving.TextFiles.write = failing
            sys.exit(main(sys.argv[1:]))
            """
        )
    )
    args = [a for flag, path in files.items() for a in (flag, path)]
    args += ["--no-validate", *(["--external-data", "always"] if external else [])]
    before = snapshot(out)
    proc = subprocess.run([sys.executable, driver, lstm, *args], capture_output=True, text=True, timeout=300)
    assert_refused(proc, "No space left on device", before, out)


@pytest.mark.parametrize("per_node", [True, False])
def test_a_converted_model_onnxruntime_cannot_load_is_no_pass(tmp_path, per_node):
    """At O1 the LayerNorm written out in ops stays fp32 between fp16
    MatMuls; onnxruntime 1.31's LayerNormFusion takes the Cast in front of
    it in and fails to load the model. Validation, which exposes every
    tensor (no fusion then), said PASS: the model as written is now loaded
    too, and the command fails (exit 3) writing nothing. At O2 it loads."""
    from models.hostile import layernorm_large_sums

    path = tmp_path / "ln.onnx"
    onnx.save(layernorm_large_sums(), path)
    out = tmp_path / "out"
    out.mkdir()
    proc = cli(path, "--level", "O1", "-o", out / "ln.fp16.onnx", *([] if per_node else ["--no-per-node"]))
    assert proc.returncode == 3, proc.stderr
    assert "cannot load the converted model" in proc.stderr and "Traceback" not in proc.stderr
    assert "which is valid ONNX" in proc.stderr  # (the checker passed it)
    assert list(out.iterdir()) == []
    proc = cli(path, "--level", "O1", "--check", "none", "-o", out / "ln.fp16.onnx")
    assert proc.returncode == 3 and "valid ONNX" not in proc.stderr and "checker has not run on it" in proc.stderr
    assert list(out.iterdir()) == []
    proc = cli(path, "--level", "O2", "-o", out / "ln.fp16.onnx")
    assert proc.returncode == 0, proc.stderr
    import onnxruntime as ort

    ort.InferenceSession(str(out / "ln.fp16.onnx"), providers=["CPUExecutionProvider"])


def test_a_converted_model_that_crashes_onnxruntime_is_no_pass_and_no_crash(tmp_path):
    """onnxruntime 1.31's CPU NchwcTransformer crashes the process (SIGSEGV)
    creating a session of an fp16 Transpose feeding a MatMul with dynamic
    dims (ViT and Whisper encoders at O2): the load check ran in-process and
    the command died without a word. It loads the model in a child process:
    exit 3, nothing written, the crash named."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[1, 0, 2]),
        helper.make_node("MatMul", ["t", "W"], ["y"], name="mm"),
    ]
    weight = numpy_helper.from_array((np.random.default_rng(0).standard_normal((16, 16)) * 0.1).astype(np.float32), "W")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", "b", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 16])],
        [weight],
    )
    path = tmp_path / "tm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    converted = tmp_path / "probe.onnx"
    onnx.save(convert(onnx.load(path), level="O2").model, converted)
    probe = [
        sys.executable,
        "-c",
        f"import onnxruntime as o; o.InferenceSession({str(converted)!r}, providers=['CPUExecutionProvider'])",
    ]
    if subprocess.run(probe, capture_output=True).returncode >= 0:
        pytest.skip("this onnxruntime loads the pattern without crashing")
    converted.unlink()
    out = tmp_path / "out"
    out.mkdir()
    proc = cli(path, "--level", "O2", "-o", out / "tm.fp16.onnx")
    assert proc.returncode == 3, proc.stderr
    assert "cannot load the converted model on cpu" in proc.stderr and "crashed (SIGSEGV)" in proc.stderr
    assert "Traceback" not in proc.stderr and list(out.iterdir()) == []


@pytest.mark.parametrize("external", [False, True])
def test_file_names_that_are_not_utf8_convert(tmp_path, external):
    """A byte the file system allows but UTF-8 does not (onnx's checker opens
    only UTF-8 paths: the output's check was an internal error); the input
    with its data in a file beside it, or not."""
    odd = os.fsdecode(b"m\xff")
    src = tmp_path / f"{odd}.onnx"
    if external:
        onnx.save(onnx.load(str(ZOO / "lstm.onnx")), str(src), save_as_external_data=True, location="w.bin", size_threshold=0)
    else:
        src.write_bytes(_zoo_bytes("lstm"))
    out = tmp_path / f"{odd}.fp16.onnx"
    args = [EXE, src, "-o", out, "--no-validate"]
    inline = ["--external-data", "never"] if external else []  # (else, read with external data, written with it)
    proc = subprocess.run([*map(str, args), *inline], capture_output=True, text=True, errors="replace", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert onnx.load(str(out)).graph.node
    # Written with external data, the model would hold its data file's name, which no ONNX string can.
    out.unlink()
    before = snapshot(tmp_path)
    proc = subprocess.run([*map(str, args), "--external-data", "always"], capture_output=True, text=True, errors="replace")
    assert proc.returncode == 2 and "ONNX strings are UTF-8" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before
