"""onnxruntime as the type oracle, where no schema can tell a tensor's type.

A schema cannot type an output whose type variable no input binds and that
admits several types (SimplifiedLayerNormalization's ``inv_std_var``: float
or double, as an attribute says). onnxruntime's own type inference, run as
it builds a session, can. Rules:

* Only node outputs of the main graph are asked (a subgraph's tensors
  cannot be graph outputs).
* The session is built on the CPU provider without graph optimizations,
  from the model as it is plus those tensors as extra outputs; nothing runs.
* A model onnxruntime cannot load, or one too large to hand over in memory
  (over 2 GB, or with tensors left in external files), tells nothing.
"""

from __future__ import annotations

import onnx

from .dtypes import TYPE_STR_TO_ELEM
from .external import PROTOBUF_LIMIT, has_external, payload_bytes


def session_types(model: onnx.ModelProto, names: list[str]) -> dict[str, int]:
    """The element types onnxruntime infers for ``names`` (outputs of the
    main graph's nodes); a name it cannot type is left out. ``model`` is
    returned as it was given (its outputs are appended, then removed)."""
    if not names or has_external(model) or payload_bytes(model) > PROTOBUF_LIMIT:
        return {}
    import onnxruntime as ort

    graph = model.graph
    before = len(graph.output)
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    try:
        data = model.SerializeToString()
    finally:
        del graph.output[before:]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception:  # (onnxruntime refuses the model: it tells nothing; the conversion goes on without)
        return {}
    wanted = set(names)
    found = {}
    for arg in session.get_outputs():
        t = TYPE_STR_TO_ELEM.get(arg.type)
        if arg.name in wanted and t:
            found[arg.name] = t
    return found
