"""amp-convert: automatic mixed precision for ONNX models.

Pipeline: load -> plan -> rewrite -> clean up -> check -> validate -> report -> save.
"""

import gc as _gc

# Importing this package imports onnx and numpy: tens of thousands of
# long-lived objects, which the cyclic collector, run again and again while
# they are made, only scans over (a fifth of the import time). It is off
# while the package imports, and on again after (if it was on). What the
# import made is then filed with the oldest objects (freezing and
# unfreezing moves every tracked object there): left young, all of it
# would be scanned by the first collection after the import (20-35 ms).
# Skipped where the process froze objects of its own: unfreezing would
# hand those back to the collector.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from .api import auto_mixed_precision, custom_mixed_precision, get_black_list, get_white_list
    from .errors import AmpError, ConversionError
    from .options import ConvertOptions
    from .pipeline import ConversionResult, convert
    from .plan import Plan, PlanEntry, Precision
finally:
    if not _gc.get_freeze_count():
        _gc.freeze()
        _gc.unfreeze()
    if _collecting:
        _gc.enable()

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
