"""What the schemas say about types, derived from ``onnx.defs`` and, for
the ops onnxruntime adds to ONNX, from onnxruntime's own schemas
(:mod:`amp_convert.ortschema`).

The classifier asks two questions of a node at the model's opset: which
inputs and outputs share a type variable (so they must change dtype
together), and does that type variable admit the low dtype. Schemas are
looked up once per (domain, op, opset) and cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import onnx
import onnx.defs

from . import ortschema
from .dtypes import TYPE_STR_TO_ELEM
from .errors import UsageError

DEFAULT_DOMAINS = ("", "ai.onnx")


def is_default_domain(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def opset_domain(domain: str) -> str:
    """The key of ``domain`` among a model's opsets: the default domain is ''."""
    return "" if is_default_domain(domain) else domain


def op_key(op_type: str, domain: str) -> str:
    """The name lists use: ``Conv`` or ``com.microsoft::FusedConv``."""
    return op_type if is_default_domain(domain) else f"{domain}::{op_type}"


@dataclass(frozen=True)
class Signature:
    """Type-level view of one op schema at one opset."""

    inputs: tuple[str, ...]  # type_str of each formal input ('T' or 'tensor(float)')
    outputs: tuple[str, ...]
    variadic_input: bool  # last formal input is variadic
    variadic_output: bool
    allowed: dict[str, frozenset[int]]  # type variable -> admitted tensor element types
    since_version: int
    source: str = "onnx"  # whose schema: 'onnx' or 'onnxruntime'

    def input_type(self, slot: int) -> str | None:
        return _slot(self.inputs, self.variadic_input, slot)

    def output_type(self, slot: int) -> str | None:
        return _slot(self.outputs, self.variadic_output, slot)

    def admits(self, type_str: str, elem_type: int) -> bool:
        """Whether a formal parameter of this type_str can hold ``elem_type``."""
        if type_str in self.allowed:
            return elem_type in self.allowed[type_str]
        return TYPE_STR_TO_ELEM.get(type_str) == elem_type


def _slot(params: tuple[str, ...], variadic: bool, slot: int) -> str | None:
    if slot < len(params):
        return params[slot]
    if variadic and params:
        return params[-1]
    return None


@lru_cache(maxsize=4096)
def signature(op_type: str, domain: str, opset: int) -> Signature | None:
    """The op's signature at ``opset``: onnx's schema, or onnxruntime's for
    an op onnx lacks (its ``source`` says which); None when neither has one
    (custom domains, local functions)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, opset_domain(domain))
    except onnx.defs.SchemaError:
        return _ort_signature(op_type, domain, opset)  # (onnxruntime is asked only of ops onnx lacks)
    if ortschema.registered(op_type, domain):
        return _ort_signature(op_type, domain, opset)
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return Signature(
        inputs=tuple(p.type_str for p in schema.inputs),
        outputs=tuple(p.type_str for p in schema.outputs),
        variadic_input=bool(schema.inputs) and schema.inputs[-1].option == variadic,
        variadic_output=bool(schema.outputs) and schema.outputs[-1].option == variadic,
        allowed=_allowed((c.type_param_str, c.allowed_type_strs) for c in schema.type_constraints),
        since_version=schema.since_version,
    )


def _ort_signature(op_type: str, domain: str, opset: int) -> Signature | None:
    schema = ortschema.extra_schema(op_type, domain, opset)
    if schema is None:
        return None
    return Signature(
        inputs=tuple(p.type_str for p in schema.inputs),
        outputs=tuple(p.type_str for p in schema.outputs),
        variadic_input=bool(schema.inputs) and schema.inputs[-1].option == "variadic",
        variadic_output=bool(schema.outputs) and schema.outputs[-1].option == "variadic",
        allowed=_allowed(schema.constraints),
        since_version=schema.since_version,
        source="onnxruntime",
    )


def _allowed(constraints: Iterable[tuple[str, Iterable[str]]]) -> dict[str, frozenset[int]]:
    return {name: frozenset(TYPE_STR_TO_ELEM[t] for t in allowed if t in TYPE_STR_TO_ELEM) for name, allowed in constraints}


@lru_cache(maxsize=1)
def known_default_ops() -> frozenset[str]:
    """The default-domain op types onnx defines."""
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history() if is_default_domain(s.domain))


def is_known_default_op(name: str) -> bool:
    """Whether onnx or onnxruntime defines this default-domain op type."""
    return name in known_default_ops() or name in ortschema.extra_default_ops()


def validate_op_names(names: Iterable[str], what: str) -> list[str]:
    """Check user-given op types (``what``: the option's field); unknown names are a UsageError."""
    result = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if "::" in name:
            domain, _, op = name.partition("::")
            if not domain or not op:
                raise UsageError(f"`{what}`: malformed op type {raw!r} (write DOMAIN::OpType)", what)
            name = op_key(op, domain)
        elif not is_known_default_op(name):
            hint = _close_match(name)
            raise UsageError(
                f"`{what}`: unknown ONNX op type {raw!r}"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + "; custom-domain ops are written DOMAIN::OpType, e.g. com.microsoft::FusedConv",
                what,
            )
        result.append(name)
    return result


def _close_match(name: str) -> str | None:
    lower = {op.lower(): op for op in known_default_ops()}
    return lower.get(name.lower())


def model_opsets(model: onnx.ModelProto | onnx.FunctionProto) -> dict[str, int]:
    """Opset per domain, with the default domain under '' (a model's, or a local function's)."""
    return {opset_domain(o.domain): o.version for o in model.opset_import}


@lru_cache(maxsize=1024)
def first_opset_admitting(op_type: str, domain: str, opset: int, elem_type: int) -> int | None:
    """The first opset after ``opset`` whose schema of the op admits
    ``elem_type`` for all its float type variables, if any (for hints)."""
    newest = onnx.defs.onnx_opset_version() if is_default_domain(domain) else opset
    for version in range(opset + 1, newest + 1):
        sig = signature(op_type, domain, version)
        if sig is None or sig.since_version <= opset:
            continue
        floats = [t for t, allowed in sig.allowed.items() if onnx.TensorProto.FLOAT in allowed]
        if floats and all(elem_type in sig.allowed[t] for t in floats):
            return sig.since_version
    return None
