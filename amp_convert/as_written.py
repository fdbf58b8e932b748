"""Whether onnxruntime loads a low-precision model as written.

Validation runs something else than the model itself: its emulation twin,
or a copy that exposes its tensors, which onnxruntime's graph optimizations
may treat otherwise. So a low-precision candidate is also loaded as written,
in a child process (:class:`amp_convert.runner.LoadCheck`), and judged here:
it loads; it lacks only a CPU kernel the emulation stands in for (a note);
or it is refused (:class:`~amp_convert.errors.RefusedAsWritten`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from .errors import RefusedAsWritten
from .runner import LoadCheck

# onnxruntime 1.31's two ways of saying that no kernel of a provider takes a
# node (its type, or its opset): the default domain's, and a contrib op's.
_MISSING_KERNEL = re.compile(
    r"Could not find an implementation for (?P<op>[\w.]+)\((?P<version>\d+)\) node with name '(?P<node>[^']*)'"
    r"|Failed to find kernel for (?P<op_>[\w.]+)\((?P<version_>\d+)\) \(node:'(?P<node_>[^']*)'"
)


_AIMED = {"cuda": "CUDA", "none": "no provider in particular (`target_provider` none)"}


@dataclass(frozen=True)
class MissingKernel:
    """The node onnxruntime found no kernel for (the first it met)."""

    op: str  # a contrib op's with its domain: com.microsoft.BiasAdd
    version: int
    node: str


def missing_kernel(refusal: str) -> MissingKernel | None:
    """The node of a refusal (:func:`amp_convert.runner.load_refusal`'s
    line) that is a missing kernel (onnxruntime's NOT_IMPLEMENTED); None
    for any other."""
    found = _MISSING_KERNEL.search(refusal) if "NOT_IMPLEMENTED" in refusal else None
    if found is None:
        return None
    op, version, node = found.group("op", "version", "node") if found.group("op") else found.group("op_", "version_", "node_")
    return MissingKernel(op, int(version), node)


@dataclass(frozen=True)
class AsWritten:
    """What onnxruntime made of a model as written (see :class:`PendingAsWritten`)."""

    refusal: str | None  # onnxruntime's reason; None: it loads
    note: str = ""  # the refusal validation stands behind, said in a line (a missing CPU kernel)

    @property
    def sound(self) -> bool:
        """Whether nothing in the model itself stops onnxruntime (it loads, or lacks only a CPU kernel)."""
        return self.refusal is None or bool(self.note)


class PendingAsWritten:
    """Load a model as written where validation runs something else, in a
    child process started now, and judge what onnxruntime says when asked:
    validation runs meanwhile. Use it as a context manager: leaving it stops
    a load still running and removes the model's copy.

    Args:
        model: the model, in memory.
        low_elem: its low dtype (an onnx element type).
        provider: the provider validation runs on, cuda or cpu.
        emulated: whether validation runs its emulation twin.
        base_dir: the folder of its external data, if it has any.
        role: which model it is, for the error ("candidate" or "reference").
        aimed_at: the provider the model is meant to run on (``target_provider``).

    Raises:
        OSError: the model's temporary copy cannot be written or the child cannot start.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        low_elem: int,
        provider: str,
        emulated: bool,
        base_dir: str | os.PathLike | None = None,
        role: str = "candidate",
        aimed_at: str = "cuda",
    ):
        self._low_elem = low_elem
        self._provider = provider
        self._emulated = emulated
        self._role = role
        self._aimed_at = aimed_at.lower()
        self._check = LoadCheck(model, provider, base_dir)

    def result(self) -> AsWritten:
        """What onnxruntime made of the model (waits for it the first time):
        it loads, or (validation running the emulation on the CPU for a
        model aimed at another provider) it lacks a CPU kernel, which the
        note says.

        Raises:
            RefusedAsWritten: any other refusal (a type or graph error, a
                crash, a kernel missing where the model is meant to run): the
                real run would not load it.
        """
        refusal = self._check.refusal()
        if refusal is None:
            return AsWritten(None)
        kernel = missing_kernel(refusal)
        if kernel is None or not self._emulated or self._provider != "cpu" or self._aimed_at == "cpu":
            raise RefusedAsWritten(refusal, self._role, self._provider)
        dtype = "bfloat16" if self._low_elem == TensorProto.BFLOAT16 else "float16"
        where = f"node {kernel.node}" if kernel.node else "an unnamed node"
        aimed = _AIMED.get(self._aimed_at, self._aimed_at)
        return AsWritten(
            refusal,
            f"onnxruntime's CPU provider has no {dtype} kernel for {kernel.op}({kernel.version}) ({where}, the first "
            f"it met): expected for a model aimed at {aimed}; validated through the emulation",
        )

    def sound(self) -> bool:
        """:attr:`AsWritten.sound` of :meth:`result` (which may raise)."""
        return self.result().sound

    def close(self) -> None:
        """Stop the load if it still runs and remove the model's copy."""
        self._check.close()

    def __enter__(self) -> PendingAsWritten:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
