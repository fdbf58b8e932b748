"""Kernel availability: a node runs low only where the target execution
provider has a kernel for its op in the low dtype.

Rules, for a node of op (domain, type) at its domain's opset:

* The target provider's table (:func:`amp_convert.kernels.kernel_table`)
  lists kernels that serve the op at that opset, none in the low dtype: the
  node stays fp32 ("no bfloat16 kernel for GlobalAveragePool on
  CUDAExecutionProvider (onnxruntime 1.25)").
* The target provider has no kernel of the op at that opset at all:
  onnxruntime runs such a node on the CPU provider, whose table decides the
  same way.
* Neither has one: onnxruntime expands the op as a function or refuses it
  whatever its type; this rule says nothing.
* Target ``none``: no filtering.
"""

from __future__ import annotations

from .dtypes import LowDtype
from .kernels import CPU, KernelTable, kernel_table, provider_name


class KernelRule:
    """Answers, per op, whether the target provider would run it in ``low``.

    The tables are read on the first question: a plan with no low node never
    reads them."""

    def __init__(self, target: str, low: LowDtype) -> None:
        """``target``: 'cuda', 'cpu', 'none' or a full provider name.

        Raises AmpError for an unknown provider."""
        self.provider = provider_name(target)
        self.low = low
        self._answers: dict[tuple[str, str, int], str | None] = {}

    def missing(self, op_type: str, domain: str, opset: int) -> str | None:
        """Why ``op_type`` of ``domain`` at ``opset`` cannot run low on the
        target; None where it can, or where the tables cannot tell."""
        if self.provider is None:
            return None
        key = (op_type, domain, opset)
        if key not in self._answers:
            self._answers[key] = self._why(op_type, domain, opset)
        return self._answers[key]

    def _why(self, op_type: str, domain: str, opset: int) -> str | None:
        target = kernel_table(self.provider)
        found = target.low_kernel(domain, op_type, opset, self.low.onnx_type)
        if found is None and self.provider != CPU:
            cpu = kernel_table(CPU)
            if cpu.low_kernel(domain, op_type, opset, self.low.onnx_type) is False:
                return (
                    f"no {self.low.name} kernel for {op_type} on {self.provider} (none of its kernels serves opset "
                    f"{opset}) nor on {CPU}, which runs it instead ({_release(cpu)})"
                )
            return None
        if found is False:
            return f"no {self.low.name} kernel for {op_type} on {self.provider} ({_release(target)})"
        return None

    def note(self, kept: int) -> str | None:
        """The plan's note on the tables behind the rule, where it kept ``kept`` nodes fp32 (None if none)."""
        if self.provider is None or not kept:
            return None
        return (
            f"kernels: {kept} node(s) kept fp32 for want of a {self.low.name} kernel on {self.provider}, "
            f"by the {kernel_table(self.provider).source} (`target_provider` none turns this off)"
        )


def _release(table: KernelTable) -> str:
    return f"onnxruntime {table.release}"
