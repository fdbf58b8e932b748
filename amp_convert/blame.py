"""Whose failure an onnxruntime failure is: the input's (a usage error), or
the conversion's (a ConversionError), and what to say about it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .errors import ConversionError, InputError, LoadFailure, ModelFailure, NeitherLoads, RefusedAsWritten, TwinFailure


@contextlib.contextmanager
def run_failures(source, names: tuple[str, str] | None = None, check: str = "full") -> Iterator[None]:
    """Turn a :class:`ModelFailure` raised inside into the error of whoever caused it.

    A model onnxruntime could not load, or run on the samples of ``source``
    (an :class:`~amp_convert.inputs.InputSource`, which says what to try
    where the samples may be to blame), is an InputError naming it; where
    neither model of a comparison loads, both are named. ``names``: what to
    call the reference and the candidate (compare's files); None in a
    conversion, whose candidate is the converted model: its failure where
    the input loaded and ran is a ConversionError. So is an emulation twin
    onnxruntime cannot load where it loads the model itself (the twin is
    amp-convert's construction), and a converted model onnxruntime refuses
    as written (``check``: the checker's mode it passed, which the message
    says). A failure no role was given to passes through unchanged.
    """
    try:
        yield
    except ModelFailure as e:
        if e.role is None:
            raise
        reference, candidate = names or ("the input model", "the converted model")
        if isinstance(e, TwinFailure):
            emulated = reference if e.role == "reference" else candidate
            raise ConversionError(
                f"onnxruntime cannot load the emulation twin of {emulated} (the float32 copy amp-convert builds to "
                f"round as its fp16/bf16 tensors do), though it loads {emulated} as written; `emulate` never "
                f"validates without it: {e.detail}"
            ) from None
        if isinstance(e, NeitherLoads) and names is not None:
            both = e.detail if e.other == e.detail else f"{reference}: {e.detail}; {candidate}: {e.other}"
            raise InputError(f"neither {reference} nor {candidate} can be loaded by onnxruntime: {both}") from None
        if isinstance(e, RefusedAsWritten) and names is None and e.role == "candidate":
            raise ConversionError(refused_converted(e, check)) from None
        loading = isinstance(e, LoadFailure)
        failed = "cannot be loaded by onnxruntime" if loading else "fails to run"
        if e.role == "reference":
            raise InputError(f"{reference} {failed}{'' if loading else source.failure_hint()}: {e.detail}") from None
        if names is None:
            raise ConversionError(f"{candidate} {failed} where the input model runs: {e.detail}") from None
        raise InputError(f"{candidate} {failed} where {reference} runs: {e.detail}") from None


def refused_converted(refused: RefusedAsWritten, check: str) -> str:
    """The line for a converted model onnxruntime refuses as written (the
    pipeline's checker passed it in mode ``check``)."""
    import onnxruntime

    prefix = f"onnxruntime {onnxruntime.__version__} cannot load the converted model on {refused.provider}"
    if check == "none":
        return (
            f"{prefix} ({refused.detail}); onnx's checker has not run on it (`check` none): `check` full tells "
            "whether the conversion made it invalid"
        )
    return f"{prefix}, which is valid ONNX: {refused.detail}; try another level, or keep the nodes it involves fp32 (`keep_fp32`)"
