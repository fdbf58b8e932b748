"""What a graph transformation pass returns, in the manner of onnx-ir's
passes: each pass is a small class whose docstring lists its rules, and
calling it on a model changes the model in place and says what it did."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx


@dataclass
class PassResult:
    """One pass's outcome.

    ``model``: the model passed in, changed in place; ``modified``: whether
    the pass changed it; ``count``: how many nodes it bypassed or removed;
    ``removed``: the nodes it removed, in any graph: the very objects the
    graphs held (the nodes it keeps stay those objects too), so an index of
    the model made before the pass finds them by identity, whichever body
    they were in; ``bypassed``: the output names of the nodes it bypassed
    (readers now read another tensor), which a later pass may remove.
    """

    model: onnx.ModelProto
    modified: bool
    count: int = 0
    removed: list[onnx.NodeProto] = field(default_factory=list)
    bypassed: set[str] = field(default_factory=set)
