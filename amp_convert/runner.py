"""onnxruntime sessions: provider choice and intermediate-tensor exposure."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from .dtypes import FLOAT_TYPES
from .emulate import LOW_TYPES, decide_emulation, emulation_twin, low_inputs, low_io
from .errors import AmpError, LoadFailure, RunFailure, TwinFailure
from .external import PROTOBUF_LIMIT, has_external, payload_bytes, write_with_external_data
from .metrics import is_float
from .options import PROVIDERS
from .saving import scratch_folder

_CUDA = "CUDAExecutionProvider"
_CPU = "CPUExecutionProvider"


def _ort():
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # failures reach the user as amp-convert's one line
    return onnxruntime


@lru_cache(maxsize=1)
def cuda_usable() -> tuple[bool, str]:
    """Whether a CUDA session really runs on the GPU (the provider can be
    listed by onnxruntime-gpu on a machine without one)."""
    ort = _ort()
    if _CUDA not in ort.get_available_providers():
        return False, "this onnxruntime build has no CUDA provider"
    probe = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", 1, [1])],
            [helper.make_tensor_value_info("y", 1, [1])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    probe.ir_version = 7
    ort.set_default_logger_severity(4)  # a missing CUDA library is logged as an error: expected here
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), providers=[_CUDA, _CPU])
    except Exception as e:  # onnxruntime raises its own exception types
        return False, f"CUDA provider failed to start ({str(e).splitlines()[0][:120]})"
    finally:
        ort.set_default_logger_severity(4)
    if sess.get_providers()[0] != _CUDA:
        return False, "no usable CUDA device"
    return True, "CUDA device found"


def choose_provider(requested: str) -> tuple[str, str]:
    """('cuda' | 'cpu', why)."""
    if requested not in PROVIDERS:
        raise AmpError(f"unknown provider {requested!r}: use auto, cuda or cpu")
    if requested == "cpu":
        return "cpu", "requested"
    ok, why = cuda_usable()
    if requested == "cuda" and not ok:
        raise AmpError(f"`provider` cuda: {why}")
    return ("cuda", why) if ok else ("cpu", why)


# A twin's Casts of a tensor that is low in the model it emulates read a
# float32 tensor there: they change nothing, and onnxruntime 1.31's
# CastElimination, removing one that feeds a Mul by a Div(1, s) which
# DivMulFusion turns into a Div, leaves that Div reading the removed Cast's
# output ("Invalid model. Node input 'h_fp32' is not a graph input ..."): an
# O1 RMSNorm, x * (1 / sqrt(...)) in fp32 behind a low x. A twin keeps them
# (a copy each).
TWIN_DISABLED_OPTIMIZERS = ("CastElimination",)


def session(
    model: onnx.ModelProto,
    provider: str,
    base_dir: str | os.PathLike | None = None,
    plan_reuse: bool = True,
    disabled_optimizers: Sequence[str] = (),
):
    """An onnxruntime session. Models with external data (read from
    ``base_dir``) or over 2 GB go through a temporary folder, as onnxruntime
    reads those only from files. ``plan_reuse=False`` skips onnxruntime's
    memory-reuse planning (see :func:`runnable`); ``disabled_optimizers``:
    graph optimizations not to run (see TWIN_DISABLED_OPTIMIZERS)."""
    ort = _ort()
    providers = _providers(provider)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.enable_mem_reuse = plan_reuse
    disabled = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    written: Path | None = None
    try:
        if not has_external(model) and payload_bytes(model) < PROTOBUF_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), options, providers=providers, **disabled)
        with scratch_folder() as folder:
            written = _written(model, folder, base_dir)
            return ort.InferenceSession(str(written), options, providers=providers, **disabled)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoadFailure(_scratch_unnamed(first, written)) from None


_LOAD_IN_CHILD = """
import sys
import onnxruntime as ort
options = ort.SessionOptions()
options.log_severity_level = 4
try:
    ort.InferenceSession(sys.argv[1], options, providers=sys.argv[2].split(","))
except Exception as e:
    text = str(e).strip()
    sys.exit(text.splitlines()[0] if text else type(e).__name__)
"""


class LoadCheck:
    """onnxruntime loading a model as written, with its default
    optimizations, in a child process that runs while the caller goes on:
    some of its graph optimizations crash the process on some valid models
    (1.31's NchwcTransformer on an fp16 Transpose feeding a MatMul). Use it
    as a context manager: leaving it stops a child still running and removes
    the model's temporary copy.

    Args:
        model: the model (in memory) to load.
        provider: a resolved provider, cuda or cpu.
        base_dir: the folder of its external data, if it has any.

    Raises:
        OSError: the temporary copy cannot be written or the child cannot start.
    """

    def __init__(self, model: onnx.ModelProto, provider: str, base_dir: str | os.PathLike | None = None):
        self._stack = contextlib.ExitStack()
        self._asked = False
        self._refusal: str | None = None
        try:
            self._path = _written(model, self._stack.enter_context(scratch_folder()), base_dir)
            argv = [sys.executable, "-c", _LOAD_IN_CHILD, str(self._path), ",".join(_providers(provider))]
            self._child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except BaseException:
            self._stack.close()
            raise

    def refusal(self) -> str | None:
        """Why onnxruntime cannot load the model, in one line (None: it
        loads); waits for the child the first time it is asked."""
        if not self._asked:
            _, stderr = self._child.communicate()
            self._refusal, self._asked = self._reason(self._child.returncode, stderr), True
        return self._refusal

    def _reason(self, code: int, stderr: str) -> str | None:
        if code == 0:
            return None
        if code < 0:
            return f"the process loading it crashed ({signal.Signals(-code).name})"
        lines = stderr.strip().splitlines()
        return _scratch_unnamed(lines[-1], self._path) if lines else f"the process loading it exited with {code}"

    def close(self) -> None:
        """Stop the child if it still runs and remove the model's copy."""
        try:
            if self._child.poll() is None:
                self._child.kill()
                self._child.communicate()
        finally:
            self._stack.close()

    def __enter__(self) -> LoadCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_refusal(model: onnx.ModelProto, provider: str, base_dir: str | os.PathLike | None = None) -> str | None:
    """Why onnxruntime cannot load ``model`` (in memory; its external data
    in ``base_dir``) on ``provider`` (cuda or cpu) as written, with its
    default optimizations, in one line; None: it loads. Asked of a child
    process, waited for (see :class:`LoadCheck`)."""
    with LoadCheck(model, provider, base_dir) as check:
        return check.refusal()


def _scratch_unnamed(message: str, written: Path | None) -> str:
    """onnxruntime's ``message`` with the temporary copy of the model it
    read from (``written``) called that: the path is gone once the message
    is shown."""
    if written is None:
        return message
    return message.replace(str(written), "a temporary copy of the model").replace(str(written.parent), "a temporary folder")


def _providers(provider: str) -> list[str]:
    """onnxruntime's providers for ``provider`` (a resolved one: cuda or cpu): CUDA falls back to the CPU for
    the nodes it has no kernel for."""
    return [_CUDA, _CPU] if provider == "cuda" else [_CPU]


def _written(model: onnx.ModelProto, folder: Path, base_dir: str | os.PathLike | None = None) -> Path:
    """``model`` written in ``folder`` for onnxruntime to read: as one file,
    or with its tensors in a data file beside it where it has external data
    (read from ``base_dir``) or is over 2 GB (protobuf serializes no more)."""
    path = folder / "model.onnx"
    if not has_external(model) and payload_bytes(model) < PROTOBUF_LIMIT:
        path.write_bytes(model.SerializeToString())
    else:
        write_with_external_data(_copy(model), path, "model.onnx.data", Path(base_dir) if base_dir else None)
    return path


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def expose(model: onnx.ModelProto, tensors: Iterable[tuple[str, int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph also outputs the given (name, elem type) tensors."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {v.name for v in exposed.graph.output}
    for name, elem in tensors:
        if name not in present:
            exposed.graph.output.append(helper.make_tensor_value_info(name, elem, None))
            present.add(name)
    return exposed


def run(sess, feeds: dict[str, np.ndarray], role: str = "candidate") -> dict[str, Any]:
    """Every output of session ``sess`` on ``feeds``: arrays (a sparse
    tensor's dense), and where the graph outputs other types, lists
    (sequences), dicts (maps) or None (an empty optional); a failure is a
    :class:`RunFailure` of the model in ``role``."""
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunFailure(first, role) from None
    sparse = _ort().capi.onnxruntime_pybind11_state.SparseTensor
    return {n: _dense(n, v) if isinstance(v, sparse) else v for n, v in zip(names, values, strict=True)}


def _dense(name: str, sparse) -> np.ndarray:
    """The array an onnxruntime SparseTensor stands for (a sparse Constant's
    output is one): what the models compute is its values, not their
    encoding. COO only, the format onnxruntime gives them in."""
    coo = _ort().OrtSparseFormat.ORT_SPARSE_COO
    if sparse.format != coo:
        raise AmpError(
            f"output {name!r} is a sparse tensor in {sparse.format.name}, which validation cannot read; use `validate` false"
        )
    shape = tuple(sparse.dense_shape())
    values, indices = sparse.values(), sparse.get_coo_data().indices()
    dense = np.zeros(shape, values.dtype)
    # (linear indices, or one row of coordinates per value)
    dense.flat[indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)] = values
    return dense


def value_bytes(value: object) -> int:
    """Memory one output of :func:`run` holds: a tensor's, or what a
    sequence (a list), map (a dict) or optional (None where empty) holds."""
    if value is None:
        return 0
    if isinstance(value, list):
        return sum(map(value_bytes, value))
    if isinstance(value, dict):
        return sum(value_bytes(k) + value_bytes(v) for k, v in value.items())
    return np.asarray(value).nbytes


def input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The numpy dtype each float graph input of ``model`` declares."""
    inits = {t.name for t in model.graph.initializer}
    return {
        v.name: np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
        for v in model.graph.input
        if v.name not in inits and v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in FLOAT_TYPES
    }


def conform(feeds: dict[str, np.ndarray], dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    """``feeds`` with each float array cast to the dtype its input declares
    (an fp16 sample for an emulation twin's float input, an fp32 sample
    rounded for a model that reads fp16); other arrays as they are."""
    out = {}
    for name, array in feeds.items():
        want = dtypes.get(name)
        if want is not None and array.dtype != want and is_float(array.dtype):
            array = array.astype(want)
        out[name] = array
    return out


@dataclass
class Runnable:
    """A session of a model as validation runs it: as is, or its emulation twin."""

    session: object
    emulated: bool
    note: str
    inputs: dict[str, np.dtype]
    twin: onnx.ModelProto | None = None  # the emulation twin that runs, for another session of it
    aliases: dict[str, str] | None = None  # float32 copy -> bf16 tensor it stands for
    rounded: dict[str, np.dtype] | None = None  # the twin's inputs whose feeds it rounds (emulate.low_inputs)
    role: str = "candidate"  # which model it is (see RunFailure)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        feeds = conform(feeds, self.inputs)
        for name, low in (self.rounded or {}).items():
            if name in feeds:
                feeds[name] = feeds[name].astype(low).astype(np.float32)
        values = run(self.session, feeds, self.role)
        for alias, name in (self.aliases or {}).items():
            values[name] = values.pop(alias)
        return values


def _expose_widened(model: onnx.ModelProto, tensors: list[tuple[str, int]]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``expose``, with bf16 tensors read through a Cast to float32:
    onnxruntime's Python API returns no bfloat16 arrays."""
    exposed = expose(model, ((n, t) for n, t in tensors if t != TensorProto.BFLOAT16))
    graph = exposed.graph
    taken = {x for node in graph.node for x in (*node.input, *node.output, node.name)}
    taken.update(v.name for v in (*graph.input, *graph.output))
    aliases: dict[str, str] = {}
    for name, elem in tensors:
        if elem != TensorProto.BFLOAT16 or name in aliases.values():
            continue
        alias = f"{name}__amp_fp32"
        while alias in taken:
            alias += "_"
        taken.add(alias)
        graph.node.append(helper.make_node("Cast", [name], [alias], to=TensorProto.FLOAT, name=alias))
        graph.output.append(helper.make_tensor_value_info(alias, TensorProto.FLOAT, None))
        aliases[alias] = name
    return exposed, aliases


def runnable(
    model: onnx.ModelProto,
    low_elem: int | None,
    provider: str,
    mode: str = "auto",
    tensors: Iterable[tuple[str, int]] = (),
    base_dir: str | os.PathLike | None = None,
    role: str = "candidate",
    twin: onnx.ModelProto | None = None,
    sound: Callable[[], bool] | None = None,
) -> Runnable:
    """A session of ``model`` (``low_elem``: its low dtype, from
    ``detect_low_dtype``; ``tensors``: intermediate (name, elem type) pairs
    to expose), through its emulation twin when ``mode`` and ``provider``
    call for one (``twin``: one already built). Under
    ``mode='auto'``, a low-precision model onnxruntime cannot load as is
    (e.g. a bf16 kernel missing on CUDA) falls back to the emulation; an
    fp32 one (``low_elem`` None), whose twin would round nothing, is run as
    written without the optimizations a twin runs without
    (TWIN_DISABLED_OPTIMIZERS: onnxruntime 1.31 refuses some valid fp32
    models after them), its refusal then its own failure. A twin that
    onnxruntime cannot load, where it loads the model as written, is a
    :class:`TwinFailure`: the twin, not the model, is to blame (``sound``:
    asked then whether the model loads as written, or lacks only a kernel the
    emulation stands in for, and free to raise what it found, e.g.
    :meth:`amp_convert.as_written.PendingAsWritten.sound`; by default
    :func:`load_refusal` is asked)."""
    tensors = list(tensors)
    emulated, note = decide_emulation(mode, provider, low_elem, low_io(model), role)

    def start(emulate: bool, bare: bool = False) -> Runnable:
        nonlocal twin
        if emulate and twin is None:
            twin = emulation_twin(model, base_dir)
        run_model = twin if emulate else model
        if emulate:  # the twin keeps every tensor's name; its low tensors are float
            exposed, aliases = expose(twin, ((n, TensorProto.FLOAT if t in LOW_TYPES else t) for n, t in tensors)), {}
        else:
            exposed, aliases = _expose_widened(model, tensors)
        # onnxruntime's memory-reuse planner grows quadratically on a twin's
        # chains of Cast pairs (0.46 s against 0.06 s for the twin of an
        # 860-node OCR model); a twin that exposes nothing (the auto search's
        # trials) runs without that plan, its arena still recycling buffers.
        # (With tensors exposed the plan pays for itself in run time.)
        try:
            sess = session(
                exposed,
                provider,
                base_dir,
                plan_reuse=not (emulate and not tensors),
                disabled_optimizers=TWIN_DISABLED_OPTIMIZERS if emulate or bare else (),
            )
        except LoadFailure as e:
            raise LoadFailure(e.detail, role) from None
        rounded = low_inputs(model) if emulate else None
        return Runnable(sess, emulate, note, input_dtypes(run_model), twin if emulate else None, aliases, rounded, role)

    try:
        return start(emulated)
    except AmpError as e:
        loads = sound if sound is not None else lambda: load_refusal(model, provider, base_dir) is None
        if emulated and isinstance(e, LoadFailure) and loads():
            raise TwinFailure(e.detail, role) from None
        if emulated or mode != "auto":
            raise
        if low_elem is None:
            skipped = ", ".join(TWIN_DISABLED_OPTIMIZERS)
            note = f"{note}; onnxruntime refused it as written ({str(e)[:160]}): run without {skipped}"
            try:
                return start(False, bare=True)
            except AmpError:
                raise e from None
        dtype = "bf16" if low_elem == TensorProto.BFLOAT16 else "fp16"
        note = f"the real {dtype} run failed ({str(e)[:160]}); emulated instead"
        return start(True)
