"""Work on the input done ahead of the converter.

Without validation, a large input is checked by a forked child (see
:class:`amp_convert.load.BackgroundCheck`). Before it checks, that child
works out, from the model's bytes and on another core, what the converter
would otherwise work out itself: the main graph's op types, domains and
node names (which the converter reads while it reads the nodes' inputs and
outputs), then the facts on its constants (their statistics and their
values in the low dtype), needed once the model is indexed. The converter
takes them by name when it needs them (``ahead("columns")``,
``ahead("constants")``) and works out itself whatever does not come or
does not fit.

(The main graph's types were tried here too: the child, which must parse
and index the model first, was 0.3 s late with them on a 100k-node graph.)
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from .dtypes import LowDtype
from .graph import NodeColumns, graph_initializers, string_columns
from .safety import ConstantFacts, graph_constant_facts

# What work_ahead gives, in the order it gives them (and the converter asks for them).
RESULTS = ("columns", "constants")


def work_ahead(data: bytes, low: LowDtype) -> Iterator[tuple[str, object]]:
    """(name, result) pairs, in the order of RESULTS: the main graph's
    :class:`NodeColumns`, then its :class:`ConstantFacts` in ``low``."""
    graph = onnx.ModelProto.FromString(data).graph
    nodes = list(graph.node)
    ops, domains, names = string_columns(nodes)
    yield "columns", NodeColumns.of(ops, domains, names)
    yield "constants", graph_constant_facts(graph_initializers(graph), nodes, ops, low)


def fitting_facts(facts: object, low: LowDtype) -> list[ConstantFacts] | None:
    """``facts`` if they are facts on constants in ``low``, else None."""
    if isinstance(facts, list) and all(isinstance(f, ConstantFacts) and f.low == low.key for f in facts):
        return facts
    return None
