"""amp-convert: automatic mixed precision for ONNX models.

Pipeline: load -> plan -> rewrite -> clean up -> check -> validate -> report -> save.
The Python API (:mod:`amp_convert.api`) does all of it; the command line
only parses options into its calls. Names are loaded on first use, so the
command's ``--help`` does not wait for onnx.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .version import __version__ as __version__

# Public name -> the module that defines it.
_EXPORTS = {
    **dict.fromkeys(
        ("ConfigFile", "Report", "Run", "compare", "convert", "convert_file", "load_config", "save", "validate"), "api"
    ),
    **dict.fromkeys(("AmpError", "ConversionError", "InputError", "InternalError", "UsageError"), "errors"),
    **dict.fromkeys(("auto_mixed_precision", "custom_mixed_precision", "get_black_list", "get_white_list"), "mindspore"),
    **dict.fromkeys(("AutoOptions", "ConvertOptions", "OutputOptions", "ValidationOptions"), "options"),
    "ConversionResult": "pipeline",
    **dict.fromkeys(("Plan", "PlanEntry", "Precision"), "plan"),
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_convert' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
