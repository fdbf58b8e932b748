"""onnxruntime's operator schemas: the second source of truth beside ``onnx.defs``.

onnxruntime ships schemas for the ops it adds to ONNX: the com.microsoft
contrib ops that its transformer optimizer fuses graphs into (Attention,
SkipLayerNormalization, EmbedLayerNormalization, FastGelu, ...) and a few
default-domain extras (SimplifiedLayerNormalization). They come from
``onnxruntime.capi._pybind_state.get_all_operator_schema()``, with per-input
and per-output type constraints like the standard ones.

Rules:

* Only the schemas ``onnx.defs`` lacks are taken: for a standard op, onnx's
  schema is the truth.
* :func:`extra_schema` gives the one in force at an opset (the newest
  ``since_version`` not above it), for :mod:`amp_convert.schema` to type and
  classify with.
* :func:`register_with_onnx` adds them to ``onnx.defs`` (once per process),
  so that onnx's checker and its type checks hold a model that uses them to
  their constraints instead of refusing it ("No Op registered for
  SimplifiedLayerNormalization") or skipping them. It only adds: no
  standard schema changes. :func:`check_with_extras` does so where a model
  needs them.

onnxruntime is imported where first needed (it costs start-up time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import onnx
import onnx.defs

_DEFAULT = ("", "ai.onnx")


@dataclass(frozen=True)
class Parameter:
    name: str
    type_str: str  # a type variable ('T') or a fixed type ('tensor(int32)')
    option: str  # 'single', 'optional' or 'variadic'
    homogeneous: bool = True


@dataclass(frozen=True)
class OrtSchema:
    """One onnxruntime schema, as plain data."""

    name: str
    domain: str  # '' for the default domain
    since_version: int
    inputs: tuple[Parameter, ...]
    outputs: tuple[Parameter, ...]
    constraints: tuple[tuple[str, tuple[str, ...]], ...]  # (type variable, allowed type strings)
    attributes: tuple[tuple[str, str, bool], ...]  # (name, AttrType name, required)


def domain_name(domain: str) -> str:
    return "" if domain in _DEFAULT else domain


@lru_cache(maxsize=1)
def extra_schemas() -> dict[tuple[str, str], tuple[OrtSchema, ...]]:
    """(domain, op type) -> onnxruntime's schemas of an op ``onnx.defs``
    does not know, oldest first. Empty where onnxruntime cannot be imported."""
    try:
        from onnxruntime.capi import _pybind_state
    except ImportError:
        return {}
    found: dict[tuple[str, str], list[OrtSchema]] = {}
    for s in _pybind_state.get_all_operator_schema():
        domain = domain_name(s.domain)
        if (domain, s.name) not in found and onnx.defs.has(s.name, domain):
            continue  # (a standard op: onnx.defs has it)
        found.setdefault((domain, s.name), []).append(_plain(s, domain))
    return {key: tuple(sorted(v, key=lambda s: s.since_version)) for key, v in found.items()}


def _plain(s, domain: str) -> OrtSchema:
    def params(formal) -> tuple[Parameter, ...]:
        return tuple(Parameter(p.name, p.typeStr, p.option.name.lower(), bool(p.isHomogeneous)) for p in formal)

    return OrtSchema(
        name=s.name,
        domain=domain,
        since_version=int(s.since_version),
        inputs=params(s.inputs),
        outputs=params(s.outputs),
        constraints=tuple((c.type_param_str, tuple(c.allowed_type_strs)) for c in s.type_constraints),
        attributes=tuple((a.name, a.type.name, bool(a.required)) for a in s.attributes.values()),
    )


def is_extra(op_type: str, domain: str) -> bool:
    """Whether onnxruntime, not onnx, defines this op."""
    return (domain_name(domain), op_type) in extra_schemas()


def extra_schema(op_type: str, domain: str, opset: int) -> OrtSchema | None:
    """onnxruntime's schema of an op ``onnx.defs`` lacks, in force at
    ``opset`` of its domain; None where onnxruntime has none (or none that old)."""
    versions = extra_schemas().get((domain_name(domain), op_type), ())
    chosen = None
    for s in versions:
        if s.since_version <= opset:
            chosen = s
    return chosen


def extra_default_ops() -> frozenset[str]:
    """The default-domain op types only onnxruntime defines."""
    return frozenset(op for domain, op in extra_schemas() if domain == "")


ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
_registered: set[tuple[str, str]] = set()  # (domain, op type) added to onnx.defs
_tried = False


def register_with_onnx() -> bool:
    """Add onnxruntime's extra schemas to ``onnx.defs`` (once per process),
    so that onnx's checker and shape inference check a model that uses them
    against their constraints. A schema onnx cannot take is left out.
    Returns whether this call added them (False: done before)."""
    global _tried
    if _tried:
        return False
    _tried = True
    for key, versions in extra_schemas().items():
        for s in versions:
            try:
                onnx.defs.register_schema(_as_onnx(s))
            except Exception:  # (onnx refuses a few: an attribute or type it does not know; they stay unchecked)
                continue
            _registered.add(key)
    return True


def registered(op_type: str, domain: str) -> bool:
    """Whether ``onnx.defs`` holds this op's schema from onnxruntime (no import of onnxruntime)."""
    return (domain_name(domain), op_type) in _registered


def check_with_extras(run: Callable[[], None], model: onnx.ModelProto | None = None) -> None:
    """Run ``run`` (onnx's checker or shape inference on a model) knowing
    onnxruntime's ops: registered first where ``model`` imports a domain
    onnx does not define, else only where ``run`` fails without them (a
    default-domain extra such as SimplifiedLayerNormalization), then run
    again. onnxruntime is imported only then."""
    if model is not None and any(o.domain not in ONNX_DOMAINS for o in model.opset_import):
        register_with_onnx()
    try:
        run()
    except Exception:
        if not register_with_onnx():
            raise
        run()


def _as_onnx(s: OrtSchema) -> onnx.defs.OpSchema:
    op_schema = onnx.defs.OpSchema
    options = {
        "single": op_schema.FormalParameterOption.Single,
        "optional": op_schema.FormalParameterOption.Optional,
        "variadic": op_schema.FormalParameterOption.Variadic,
    }

    def formal(p: Parameter) -> onnx.defs.OpSchema.FormalParameter:
        return op_schema.FormalParameter(
            p.name,
            p.type_str,
            param_option=options[p.option],
            is_homogeneous=p.homogeneous,
            min_arity=0 if p.option == "variadic" else 1,
        )

    return op_schema(
        s.name,
        s.domain,
        s.since_version,
        inputs=[formal(p) for p in s.inputs],
        outputs=[formal(p) for p in s.outputs],
        type_constraints=[(name, list(allowed), "") for name, allowed in s.constraints],
        attributes=[
            op_schema.Attribute(name, getattr(op_schema.AttrType, kind), "", required=required)
            for name, kind, required in s.attributes
        ],
    )
