"""amp-convert: automatic mixed precision for ONNX models.

Pipeline: load -> plan -> rewrite -> clean up -> check -> validate -> report -> save.
"""

from .api import auto_mixed_precision, custom_mixed_precision, get_black_list, get_white_list
from .errors import AmpError, ConversionError
from .options import ConvertOptions
from .pipeline import ConversionResult, convert
from .plan import Plan, PlanEntry, Precision

__version__ = "0.1.0"

__all__ = [
    "AmpError",
    "ConversionError",
    "ConversionResult",
    "ConvertOptions",
    "Plan",
    "PlanEntry",
    "Precision",
    "auto_mixed_precision",
    "convert",
    "custom_mixed_precision",
    "get_black_list",
    "get_white_list",
]
