"""onnxruntime sessions: provider choice and intermediate-tensor exposure."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .errors import AmpError
from .external import PROTOBUF_LIMIT, has_external, payload_bytes, write_with_external_data

PROVIDERS = ("auto", "cuda", "cpu")
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
        raise AmpError(f"--provider cuda: {why}")
    return ("cuda", why) if ok else ("cpu", why)


def session(model: onnx.ModelProto, provider: str, base_dir: str | os.PathLike | None = None):
    """An onnxruntime session. Models with external data (read from
    ``base_dir``) or over 2 GB go through a temporary folder, as onnxruntime
    reads those only from files."""
    ort = _ort()
    providers = [_CUDA, _CPU] if provider == "cuda" else [_CPU]
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        if not has_external(model) and payload_bytes(model) < PROTOBUF_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
        with tempfile.TemporaryDirectory(prefix="amp-convert-") as folder:
            path = Path(folder) / "model.onnx"
            write_with_external_data(_copy(model), path, "model.onnx.data", Path(base_dir) if base_dir else None)
            return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AmpError(f"onnxruntime cannot load the model: {first}") from None


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


def run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AmpError(f"onnxruntime failed to run the model: {first}") from None
    return dict(zip(names, values, strict=True))
