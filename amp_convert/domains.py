"""Opset imports a model leaves out: the custom domains whose ops it uses
undeclared, where onnxruntime's schemas define them all."""

from __future__ import annotations

import onnx

from .graph import nested_graphs
from .ortschema import ONNX_DOMAINS, domain_name, extra_schemas


def undeclared_domains(model: onnx.ModelProto) -> dict[str, int]:
    """The domains the nodes of ``model``'s graph (and of its subgraphs) use
    without an opset import, where onnxruntime's schemas define every op
    used from them: domain -> the import onnxruntime would assume (the
    newest ``since_version`` of those ops). onnxruntime loads such a model;
    onnx's checker refuses it ("No opset import for domain")."""
    declared = {domain_name(o.domain) for o in model.opset_import}
    used: dict[str, set[str]] = {}
    for g in (model.graph, *nested_graphs(model.graph.node)):
        for node in g.node:
            domain = domain_name(node.domain)
            if domain not in declared:
                used.setdefault(domain, set()).add(node.op_type)
    functions = {(f.domain, f.name) for f in model.functions}
    found: dict[str, int] = {}
    for domain, ops in used.items():
        if domain in ONNX_DOMAINS or any((domain, op) in functions for op in ops):
            continue  # (onnx's own domains, and local functions, are onnx's checker's business)
        versions = [extra_schemas().get((domain, op), ()) for op in ops]
        if versions and all(versions):
            found[domain] = max(v[-1].since_version for v in versions)
    return found


def declare_domains(model: onnx.ModelProto) -> list[str]:
    """Add the opset imports :func:`undeclared_domains` finds to ``model``
    (in place); one note per import added."""
    notes = []
    for domain, version in sorted(undeclared_domains(model).items()):
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))
        notes.append(
            f"opset import {domain} {version} added: the model uses its ops without declaring it "
            "(onnxruntime assumes it; onnx's checker refuses the model without it)"
        )
    return notes
