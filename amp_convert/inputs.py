"""Validation inputs: .npz files, folders of them, Polygraphy input JSON, or
generated random samples; all checked against the model's inputs.

Samples are produced lazily, one at a time, so validation can stream them.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from .errors import AmpError
from .input_roles import InputRole, input_roles

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
# Integer inputs are often indices (token types, positions): stay at 0/1 unless told.
DEFAULT_INT_RANGE = (0, 2)
# A generated input of more elements is refused before anything is allocated
# (2**31 float32 values are 8 GiB, per sample).
MAX_GENERATED_ELEMENTS = 2**31
NPY_MAGIC = b"\x93NUMPY"
# Token inputs (ids, masks, positions: those input_roles gives a role) span
# this many tokens along a dynamic sequence axis: a prompt's length, not 1,
# within the table their positions index. A model with a KV cache gets half
# as new tokens, half as past ones (its mask spans both).
DEFAULT_TOKENS = 128
# What a dynamic dimension's name says it is ("sum": "past_sequence_length + 1").
_BATCH_DIM = re.compile(r"batch|^[bn]$", re.IGNORECASE)
_PAST_DIM = re.compile(r"past|cache", re.IGNORECASE)
_TOTAL_DIM = re.compile(r"total|all_?seq|full_?seq|kv_?seq", re.IGNORECASE)


@dataclass(frozen=True)
class InputSpec:
    """A graph input as validation sees it."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]  # ints, symbolic names, or None (unknown)
    ranked: bool = True  # False: the model gives no shape at all (any rank goes; () is a scalar)


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs excluded)."""
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        if v.type.WhichOneof("value") != "tensor_type":
            raise AmpError(
                f"input {v.name!r} is not a tensor (a sequence, map or optional): validation cannot feed it; use --no-validate"
            )
        t = v.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        dims: list[int | str | None] = []
        if t.HasField("shape"):
            for d in t.shape.dim:
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(d.dim_value)
                else:
                    dims.append(d.dim_param or None)
        specs.append(InputSpec(v.name, dtype, tuple(dims), ranked=t.HasField("shape")))
    return specs


@dataclass
class Lengths:
    """Default lengths of the dynamic dimensions of generated inputs that no
    option sets (the others are 1): by name (``dims``), by input and axis
    for an unnamed one (``axes``), and the first position of a positions
    input that follows a KV cache's past tokens (``starts``); ``past``:
    whether the model has a KV cache; ``note``: why they are not as long
    as DEFAULT_TOKENS asks."""

    dims: dict[str, int] = field(default_factory=dict)
    axes: dict[tuple[str, int], int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    past: bool = False
    note: str = ""

    def of(self, name: str, axis: int, dim: str | None) -> int:
        """The length of dimension ``dim`` (None: unnamed) of input ``name``'s ``axis``."""
        if dim is not None and dim in self.dims:
            return self.dims[dim]
        return self.axes.get((name, axis), 1)

    def text(self) -> str:
        """ "batch=1, seq=64, past_seq=64, total_seq=128" (empty: every dynamic dimension is 1)."""
        return ", ".join(f"{name}={n}" for name, n in self.dims.items())


@dataclass
class InputSource:
    """Where validation samples come from (described in the report)."""

    specs: list[InputSpec]
    files: list[Path] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: int = 2
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    flag: str = "--inputs"  # the option the files came from, for messages
    dynamic: list[str] = field(default_factory=list)  # generated inputs with dynamic dimensions no option set
    roles: dict[str, InputRole] = field(default_factory=dict)  # integer inputs' roles (input_roles.py), for generating them
    # The default lengths of dynamic dimensions no option sets (see choose_lengths; the rest are 1)
    lengths: Lengths = field(default_factory=lambda: Lengths())

    def failure_hint(self) -> str:
        """What to try when a model fails to run on these samples: files are
        the user's own; generated ones follow what the options said, 1 for a
        dimension they did not, values in a default range."""
        if self.files:
            return f" (on the samples of {self.flag})"
        if self.dynamic:
            return (
                f" (on generated inputs: the dynamic dimensions of {', '.join(self.dynamic)} were set to "
                f"{self.lengths.text() or '1'}; "
                "give real shapes with --input-shape NAME=DIMS (and value ranges with --input-range NAME=LOW:HIGH), "
                "or samples with --inputs)"
            )
        return " (on generated random inputs: give value ranges with --input-range NAME=LOW:HIGH, or samples with --inputs)"

    def describe(self) -> dict:
        if self.files:
            return {"kind": "files", "files": [str(f) for f in self.files], "notes": self.notes}
        return {
            "kind": "random",
            "samples": self.samples,
            "seed": self.seed,
            "shapes": {n: list(s) for n, s in self.shapes.items()},
            "ranges": {n: list(r) for n, r in self.ranges.items()},
            "generated": self.generated(),
            "lengths": dict(self.lengths.dims),  # (the dynamic dimensions set by default: choose_lengths)
            "notes": self.notes,
        }

    def generated(self) -> list[dict]:
        """What generated samples hold, input by input: name, dtype, shape,
        values (a range, "ones" or "0, 1, 2, ...") and why."""
        rows = []
        for spec in self.specs:
            shape = list(self.generated_shape(spec))
            role = self.roles.get(spec.name) if spec.name not in self.ranges else None
            if spec.name in self.ranges:
                low, high = self.ranges[spec.name]
                values, why = f"[{low:g}, {high:g})", "--input-range"
            elif role is not None and role.kind == "mask":
                values, why = "ones", f"a mask: {role.why}"
            elif role is not None and role.kind == "positions":
                first = self.lengths.starts.get(spec.name, 0)
                values, why = ", ".join(str(first + k) for k in range(3)) + ", ...", f"positions: {role.why}"
                if first:
                    why += f"; after {first} past tokens"
            elif role is not None and role.kind == "index" and spec.dtype != np.bool_:
                values, why = f"[0, {role.rows})", f"an index: {role.why}"
            elif spec.dtype == np.bool_:
                values, why = "{0, 1}", "default"
            else:
                low, high = DEFAULT_INT_RANGE if np.issubdtype(spec.dtype, np.integer) else DEFAULT_FLOAT_RANGE
                values, why = f"[{low:g}, {high:g})", "default"
            rows.append({"name": spec.name, "dtype": str(spec.dtype), "shape": shape, "values": values, "why": why})
        return rows

    def summary(self) -> str:
        """One line on what the generated samples hold (names, shapes, values;
        the dynamic dimensions set by default, and why they were not longer)."""
        parts = [f"{g['name']} {g['dtype']}[{'x'.join(map(str, g['shape']))}] {g['values']}" for g in self.generated()]
        dims = self.lengths.text()
        how = f" ({dims}; --input-shape sets them)" if dims else ""
        note = f" ({self.lengths.note})" if self.lengths.note else ""
        return f"inputs: {self.samples} generated sample(s){how}: " + "; ".join(parts) + note

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.files:
            yield from self._file_samples()
        else:
            rng = np.random.default_rng(self.seed)
            for _ in range(self.samples):
                yield {s.name: self._random(s, rng) for s in self.specs}

    def _file_samples(self) -> Iterator[dict[str, np.ndarray]]:
        """The files' samples, checked; files that hold none (a Polygraphy ``[]``) are refused
        naming the option and the files: a run over no sample would judge nothing."""
        read = 0
        for path in self.files:
            origin = f"{self.flag} {path}"
            for sample in _read_samples(path, origin):
                read += 1
                yield self.check(sample, origin)
        if not read:
            purpose = "calibration" if self.flag == "--calibration" else "validation"
            raise AmpError(f"no {purpose} samples in {self.flag} {', '.join(map(str, self.files))}")

    def count(self) -> int | None:
        """Number of samples when known without reading the files."""
        if not self.files:
            return self.samples
        if all(p.suffix == ".npz" for p in self.files):
            return len(self.files)
        return None

    def _named_dims(self) -> dict[str, int]:
        """Symbolic dimensions fixed by --input-shape, for the other inputs that
        share them (``batch``, ``sequence``: one value across inputs)."""
        named: dict[str, int] = {}
        for spec in self.specs:
            given = self.shapes.get(spec.name)
            if given is not None and len(given) == len(spec.shape):
                for d, value in zip(spec.shape, given, strict=True):
                    if isinstance(d, str):
                        named.setdefault(d, value)
        return named

    def generated_shape(self, spec: InputSpec) -> tuple[int, ...]:
        """The shape of ``spec``'s random samples: --input-shape, else the model's
        dims with symbolic ones shared with another input's --input-shape, else
        the default lengths (a sequence's: ``lengths``), else 1."""
        given = self.shapes.get(spec.name)
        if given is not None:
            return given
        named = self._named_dims()
        shape = []
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int):
                shape.append(d)
            elif d in named:
                shape.append(named[d])
            else:
                shape.append(self.lengths.of(spec.name, axis, d))
        return tuple(shape)

    def _random(self, spec: InputSpec, rng: np.random.Generator) -> np.ndarray:
        shape = self.generated_shape(spec)
        role = self.roles.get(spec.name) if spec.name not in self.ranges else None
        if role is not None and role.kind == "mask":
            return np.ones(shape, dtype=spec.dtype)
        if role is not None and role.kind == "positions":
            first = self.lengths.starts.get(spec.name, 0)  # (past the KV cache's tokens)
            count = (first + np.arange(shape[-1] if shape else 1)) % (role.rows or np.iinfo(spec.dtype).max)
            return np.broadcast_to(count.reshape(shape[-1:]), shape).astype(spec.dtype)
        if role is not None and role.kind == "index" and spec.dtype != np.bool_:
            high = min(role.rows, int(np.iinfo(spec.dtype).max) + 1)
            return rng.integers(0, high, size=shape, dtype=np.int64).astype(spec.dtype)
        if spec.dtype == np.bool_:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if np.issubdtype(spec.dtype, np.integer):
            low, high = self.ranges.get(spec.name, DEFAULT_INT_RANGE)
            info = np.iinfo(spec.dtype)
            first, end = math.ceil(low), math.ceil(high)  # integers in [LOW, HIGH)
            if not (info.min <= first < end <= info.max + 1):
                raise AmpError(
                    f"--input-range {spec.name}={low:g}:{high:g}: holds no {spec.dtype} value, "
                    f"or goes beyond {spec.dtype}'s [{info.min}, {info.max}]"
                )
            return rng.integers(first, end, size=shape, dtype=np.int64 if info.max < 2**63 else np.uint64).astype(spec.dtype)
        if _is_float(spec.dtype):
            low, high = self.ranges.get(spec.name, DEFAULT_FLOAT_RANGE)
            if max(abs(low), abs(high)) > float(ml_dtypes.finfo(spec.dtype).max):
                raise AmpError(f"--input-range {spec.name}={low:g}:{high:g}: beyond {spec.dtype}'s range")
            return rng.uniform(low, high, size=shape).astype(np.float32).astype(spec.dtype)
        raise AmpError(f"input {spec.name!r}: cannot generate random {spec.dtype} data; give --inputs")

    def check(self, sample: dict[str, np.ndarray], origin: str) -> dict[str, np.ndarray]:
        """Names, dtypes and shapes must match the model's inputs."""
        expected = {s.name: s for s in self.specs}
        unknown = sorted(set(sample) - set(expected))
        if unknown:
            raise AmpError(f"{origin}: input {unknown[0]!r} is not an input of the model (inputs: {', '.join(expected)})")
        missing = sorted(set(expected) - set(sample))
        if missing:
            raise AmpError(f"{origin}: missing input {missing[0]!r}")
        for name, spec in expected.items():
            array = sample[name]
            if array.dtype != spec.dtype:
                raise AmpError(f"{origin}: input {name!r} has dtype {array.dtype}, the model expects {spec.dtype}")
            if spec.ranked and len(array.shape) != len(spec.shape):
                raise AmpError(
                    f"{origin}: input {name!r} has shape {list(array.shape)}, the model expects rank {len(spec.shape)} "
                    f"{_shape_text(spec.shape)}"
                )
            for got, want in zip(array.shape, spec.shape, strict=False):
                if isinstance(want, int) and got != want:
                    raise AmpError(
                        f"{origin}: input {name!r} has shape {list(array.shape)}, the model expects {_shape_text(spec.shape)}"
                    )
        return sample


class CandidateInputs:
    """The inputs of a model compared with a reference (``compare`` takes any two models):
    it must read the same inputs as the reference, of the same dtypes (a float input may
    be of another float dtype: the samples are cast to it), and each sample must fit it."""

    def __init__(self, reference: list[InputSpec], candidate: onnx.ModelProto):
        initializers = {t.name for t in candidate.graph.initializer}
        theirs = [v.name for v in candidate.graph.input if v.name not in initializers]
        ours = [s.name for s in reference]
        if sorted(theirs) != sorted(ours):
            raise AmpError(f"the models' inputs differ: {ours} (reference) vs {theirs} (candidate)")
        bad = next(
            (v.name for v in candidate.graph.input if v.name in ours and v.type.WhichOneof("value") != "tensor_type"), None
        )
        if bad is not None:
            raise AmpError(f"the models' inputs differ: the candidate's input {bad!r} is not a tensor")
        self.specs = {s.name: s for s in input_specs(candidate)}
        self.reference = {s.name: s for s in reference}
        for name, ref in self.reference.items():
            cand = self.specs[name]
            if ref.dtype != cand.dtype and not (_is_float(ref.dtype) and _is_float(cand.dtype)):
                raise AmpError(
                    f"the models' inputs differ: {name!r} is {ref.dtype} in the reference, {cand.dtype} in the candidate"
                )

    def check(self, sample: dict[str, np.ndarray]) -> None:
        """A sample the reference takes must fit the candidate's shapes too."""
        for name, spec in self.specs.items():
            shape = sample[name].shape
            fits = not spec.ranked or (
                len(shape) == len(spec.shape)
                and all(not isinstance(w, int) or g == w for g, w in zip(shape, spec.shape, strict=True))
            )
            if not fits:
                ref = self.reference[name]
                both = len(ref.shape) == len(spec.shape) and all(
                    not (isinstance(a, int) and isinstance(b, int) and a != b) for a, b in zip(ref.shape, spec.shape, strict=True)
                )
                raise AmpError(
                    f"the models' inputs differ: {name!r} is {_shape_text(ref.shape)} in the reference, "
                    f"{_shape_text(spec.shape)} in the candidate, which does not take a sample of shape {list(shape)}"
                    + (" (give --inputs or --input-shape that fit both)" if both else "")
                )


def _is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == np.dtype(ml_dtypes.bfloat16)


def _shape_text(shape: Sequence) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def parse_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` (or ``NAME=1,3,224,224``)."""
    out = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.replace(",", "x").split("x") if d != "") if dims else ()
            if any(d < 0 for d in shape):
                raise ValueError
        except ValueError:
            raise AmpError(f"--input-shape {v!r}: expected NAME=1x3x224x224") from None
        out[name] = shape
    return out


def parse_ranges(values: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``NAME=LOW:HIGH``."""
    out = {}
    for v in values:
        name, sep, rng = v.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            low_s, high_s = rng.split(":")
            low, high = float(low_s), float(high_s)
            if not (low < high and math.isfinite(low) and math.isfinite(high)):
                raise ValueError
        except ValueError:
            raise AmpError(f"--input-range {v!r}: expected NAME=LOW:HIGH with finite LOW < HIGH") from None
        out[name] = (low, high)
    return out


def make_source(
    model: onnx.ModelProto,
    inputs: Sequence[str | Path] = (),
    shapes: Sequence[str] = (),
    ranges: Sequence[str] = (),
    samples: int = 2,
    seed: int = 0,
    flag: str = "--inputs",
    try_lengths: bool = True,
) -> InputSource:
    """Build an input source; names in shapes/ranges are checked here.
    ``flag`` is the option ``inputs`` came from (named in messages).

    Generated token inputs get a sequence of up to DEFAULT_TOKENS along a
    dynamic axis no option sets (:func:`choose_lengths`); with
    ``try_lengths``, the fp32 ``model`` runs once in onnxruntime (CPU) on
    a sample of them, shorter ones are tried where it fails, and where all
    fail every such dimension is 1, as it was (the note says so). Not tried
    for a model whose tensors are in external files."""
    specs = input_specs(model)
    shape_map, range_map = parse_shapes(shapes), parse_ranges(ranges)
    _check_given(specs, shape_map, range_map)
    if samples < 1:
        raise AmpError("--samples must be at least 1")
    if seed < 0:
        raise AmpError(f"--seed must be 0 or more, got {seed}")
    files = _expand_files(inputs, flag)
    source = InputSource(specs, files, shape_map, range_map, samples, seed, flag=flag)
    if not files:
        source.roles = input_roles(model)
        plans = list(_length_plans(specs, source.roles, source._named_dims()))
        plans = [p for p in plans[:-1] if _fits(source, p)] + plans[-1:]  # (the last, every dimension 1, as ever)
        source.lengths = plans[0]
        if try_lengths and len(plans) > 1:
            _try_lengths(model, source, plans)
        for spec in specs:
            shape = source.generated_shape(spec)
            if math.prod(shape) > MAX_GENERATED_ELEMENTS:
                raise AmpError(
                    f"input {spec.name!r}: a generated sample of shape {list(shape)} would hold {math.prod(shape):,} "
                    f"elements, more than {MAX_GENERATED_ELEMENTS:,}; give a smaller --input-shape, or samples with --inputs"
                )
        named = source._named_dims()  # (a symbolic dimension another input's --input-shape settles is not 1)
        dynamic = [
            s.name for s in specs if s.name not in shape_map and any(not isinstance(d, int) and d not in named for d in s.shape)
        ]
        source.dynamic = dynamic
        if dynamic:
            lengths = source.lengths.text()
            ones = any(
                not isinstance(d, int)
                and d not in named
                and d not in source.lengths.dims
                and (s.name, k) not in source.lengths.axes
                for s in specs
                if s.name in dynamic
                for k, d in enumerate(s.shape)
            )
            set_to = (f"{lengths}, the others 1" if ones else lengths) if lengths else "1"
            source.notes.append(f"dynamic dimensions of {', '.join(dynamic)} set to {set_to} (use --input-shape)")
        if source.lengths.note:
            source.notes.append(source.lengths.note)
    return source


def _dim_kind(name: str) -> str:
    """What a dynamic dimension's name says it is: "sum" (of others: "past_sequence_length + 1"),
    "batch", "past" (a KV cache's tokens), "total" (past and new ones) or "new" (tokens)."""
    if "+" in name:
        return "sum"
    for kind, pattern in (("batch", _BATCH_DIM), ("past", _PAST_DIM), ("total", _TOTAL_DIM)):
        if pattern.search(name):
            return kind
    return "new"


def choose_lengths(
    specs: list[InputSpec], roles: dict[str, InputRole], given: dict[str, int], tokens: int, new: int | None = None
) -> Lengths:
    """Lengths for the dynamic dimensions of the token inputs (those with a
    role) and the dimensions of a KV cache, for ``tokens`` tokens in all:

    * a batch (its name says so, or the first of two or more axes) is 1;
    * where the model has past tokens (a dimension whose name says past, as
      ``past_sequence_length``), ``new`` (default half of ``tokens``) are
      new and the rest past; a "total" dimension (``total_sequence_length``)
      is both, a sum of names (``past_sequence_length + 1``) its terms;
    * else every other dimension of a token input is ``tokens`` long.

    ``given``: the named dimensions --input-shape settles (kept; a new or
    past one given sets the other, with a total). A positions input's
    values start after the past tokens. Dimensions of other inputs keep 1
    unless they share a name with these."""
    tokens_in = [s for s in specs if s.name in roles]
    kinds: dict[str, str] = {}
    for spec in tokens_in:
        for axis, d in enumerate(spec.shape):
            if isinstance(d, str):
                kind = _dim_kind(d)
                kinds.setdefault(d, "batch" if kind == "new" and axis == 0 and len(spec.shape) >= 2 else kind)
    if not kinds and not any(d is None for s in tokens_in for d in s.shape):
        return Lengths()
    for spec in specs:  # (a KV cache's inputs: past_key_values.0.key, ...)
        for d in spec.shape:
            if isinstance(d, str) and _dim_kind(d) in ("past", "total", "sum"):
                kinds.setdefault(d, _dim_kind(d))
    terms = [t.strip() for d, k in kinds.items() if k == "sum" for t in d.split("+")]
    has_past = any(k == "past" for k in kinds.values()) or any(_dim_kind(t) == "past" for t in terms)
    known = {k: [given[d] for d, kind in kinds.items() if kind == k and d in given] for k in ("new", "past", "total")}
    first = {k: v[0] if v else None for k, v in known.items()}
    n_new, n_past = first["new"], first["past"]
    if first["total"] is not None:  # (a total given with one of its parts settles the other)
        if n_new is not None and n_past is None:
            n_past = max(first["total"] - n_new, 0)
        elif n_past is not None and n_new is None:
            n_new = max(first["total"] - n_past, 1)
    if n_new is None:
        n_new = (new or max(tokens // 2, 1)) if has_past else tokens
    if n_past is None:
        n_past = max(tokens - n_new, 0) if has_past else 0
    by_kind = {"batch": 1, "new": n_new, "past": n_past, "total": n_new + n_past}
    dims: dict[str, int] = {}
    for d, kind in kinds.items():
        if d in given:
            continue
        if kind == "sum":
            parts = [t.strip() for t in d.split("+")]
            dims[d] = sum(int(t) if t.isdigit() else given.get(t, by_kind[_dim_kind(t)]) for t in parts)
        else:
            dims[d] = by_kind[kind]
    axes = {
        (s.name, axis): 1 if axis == 0 and len(s.shape) >= 2 else n_new
        for s in tokens_in
        for axis, d in enumerate(s.shape)
        if d is None
    }
    starts = {}
    if has_past and n_past:
        for spec in tokens_in:
            last = spec.shape[-1] if spec.shape else 0
            if roles[spec.name].kind == "positions" and (last is None or (isinstance(last, str) and kinds.get(last) == "new")):
                starts[spec.name] = n_past
    return Lengths(dims, axes, starts, has_past)


def _length_plans(specs: list[InputSpec], roles: dict[str, InputRole], given: dict[str, int]) -> Iterator[Lengths]:
    """The lengths to try, best first (see :func:`choose_lengths`):
    DEFAULT_TOKENS within the smallest table positions index, then (with a
    KV cache) one new token after the rest, then half as many, down to 2;
    last every dynamic dimension at 1 (the choice before there were
    defaults). Only that last where nothing is to choose."""
    rows = [r.rows for r in roles.values() if r.kind == "positions" and r.rows]
    tokens = min([DEFAULT_TOKENS, *rows])
    first = choose_lengths(specs, roles, given, tokens)
    if first.dims or first.axes:
        yield first
        if first.past and tokens > 2:
            yield choose_lengths(specs, roles, given, tokens, new=1)
        while tokens > 2:
            tokens //= 2
            yield choose_lengths(specs, roles, given, tokens)
    yield Lengths()


def _fits(source: InputSource, lengths: Lengths) -> bool:
    """Whether every generated input holds at most MAX_GENERATED_ELEMENTS with ``lengths``."""
    held, source.lengths = source.lengths, lengths
    try:
        return all(math.prod(source.generated_shape(s)) <= MAX_GENERATED_ELEMENTS for s in source.specs)
    finally:
        source.lengths = held


def _try_lengths(model: onnx.ModelProto, source: InputSource, plans: list[Lengths]) -> None:
    """Set ``source.lengths`` to the first of ``plans`` the fp32 model runs
    on (one sample, onnxruntime's CPU provider), the last (every dimension
    1, not tried) where none does; the first failure goes in its note. A
    model that does not load, or whose tensors are in external files (not
    read here), keeps the first."""
    from .emulate import detect_low_dtype
    from .external import has_external
    from .runner import runnable

    if has_external(model):
        return
    failed = ""
    session = None
    for plan in plans[:-1]:
        source.lengths = plan
        try:
            feeds = next(iter(source))
        except AmpError:  # (a range that holds no value: the run that validates says so)
            return
        if session is None:
            try:
                session = runnable(model, detect_low_dtype(model), "cpu", "auto", (), None, "reference")
            except AmpError:
                source.lengths = plans[0]
                return  # (it does not load: the run that validates says why)
        try:
            session.run(feeds)
        except AmpError as e:
            failed = failed or f"{plans[0].text()} fails on the fp32 model: {_run_error(e)}"
            continue
        plan.note = failed
        return
    source.lengths = plans[-1]
    source.lengths.note = f"every dynamic dimension 1: {failed}"


def _run_error(e: AmpError) -> str:
    """A run's failure in few words: onnxruntime's message without its boilerplate."""
    text = getattr(e, "detail", str(e))
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Non-zero status code returned while running )?", "", text)
    text = re.sub(r"Status Message: /\S+:\d+ [^(]*\([^)]*\) ", "", text)  # (the source line and function it came from)
    return text if len(text) <= 200 else text[:197] + "..."


def check_unused(
    model: onnx.ModelProto,
    files: Sequence[str | Path] = (),
    flag: str = "--inputs",
    shapes: Sequence[str] = (),
    ranges: Sequence[str] = (),
) -> None:
    """Vet sample options a run will not read (``--no-validate``, or ``--calibration`` with the
    safety rules off) as :func:`make_source` would: a file that is not there, or a name
    that is no input of the model, is a mistake whether or not the run reads it."""
    _expand_files(files, flag)
    if shapes or ranges:
        _check_given(input_specs(model), parse_shapes(shapes), parse_ranges(ranges))


def _check_given(
    specs: list[InputSpec], shape_map: dict[str, tuple[int, ...]], range_map: dict[str, tuple[float, float]]
) -> None:
    """--input-shape and --input-range name inputs of the model; a shape fits its input's."""
    names = {s.name for s in specs}
    for option, given in (("--input-shape", shape_map), ("--input-range", range_map)):
        for name in given:
            if name not in names:
                raise AmpError(f"{option}: {name!r} is not an input of the model (inputs: {', '.join(sorted(names))})")
    for spec in specs:
        if spec.name in shape_map:
            shape = shape_map[spec.name]
            if spec.ranked and len(shape) != len(spec.shape):
                raise AmpError(f"--input-shape {spec.name}: rank {len(shape)}, the model expects {_shape_text(spec.shape)}")
            for got, want in zip(shape, spec.shape, strict=False):
                if isinstance(want, int) and got != want:
                    raise AmpError(f"--input-shape {spec.name}: {list(shape)} does not fit {_shape_text(spec.shape)}")


def _expand_files(inputs: Sequence[str | Path], flag: str) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise AmpError(f"{flag} {p}: the folder holds no .npz files")
            files.extend(found)
        elif p.is_file():
            if p.suffix not in (".npz", ".json"):
                raise AmpError(f"{flag} {p}: expected a .npz file, a folder of them, or a Polygraphy .json")
            files.append(p)
        else:
            raise AmpError(f"{flag} {p}: no such file or folder")
    return files


def _read_samples(path: Path, origin: str) -> Iterator[dict[str, np.ndarray]]:
    if path.suffix == ".npz":
        yield _read_npz(path, origin)
    else:
        yield from _read_polygraphy_json(path, origin)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _read_npz(path: Path, origin: str) -> dict[str, np.ndarray]:
    """The arrays of an ``np.savez`` archive; every member must be an .npy array."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            hint = " (it is a single .npy array)" if f.read(len(NPY_MAGIC)) == NPY_MAGIC else ""
        raise AmpError(
            f"{origin}: is not an .npz (zip) archive{hint}; save inputs with np.savez(path, NAME=array, ...)"
        ) from None
    except OSError as e:
        raise AmpError(f"{origin}: cannot be read ({e.strerror or _first_line(e)})") from None
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for info in archive.infolist():
            where = f"{origin}: member {info.filename!r}"
            if not info.filename.endswith(".npy"):
                raise AmpError(f"{where} is not an .npy array; save inputs with np.savez(path, NAME=array, ...)")
            try:
                with archive.open(info) as member:
                    arrays[info.filename.removesuffix(".npy")] = _read_npy(member, info.file_size, where, "an .npy array")
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as e:
                # (corrupt or truncated data, an unsupported compression, an encrypted member)
                raise AmpError(f"{where} cannot be read ({_first_line(e)}); the archive is corrupt") from None
    return arrays


def _read_npy(fp: IO[bytes], size: int, where: str, kind: str) -> np.ndarray:
    """One .npy array of ``size`` bytes from ``fp``; the shape its header
    declares is checked against the bytes present before anything is allocated."""
    try:
        version = np.lib.format.read_magic(fp)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(fp)
    except ValueError as e:
        raise AmpError(f"{where} is not {kind} ({_first_line(e)})") from None
    if dtype.hasobject:
        raise AmpError(f"{where} holds object arrays (pickled Python objects), refused; save plain numeric arrays")
    declared, present = math.prod(shape) * dtype.itemsize, size - fp.tell()
    if declared > present:
        raise AmpError(
            f"{where} declares shape {list(shape)} of {dtype} ({declared:,} bytes) but holds {present:,} bytes; "
            "it is corrupt or truncated"
        )
    fp.seek(0)
    try:
        return np.lib.format.read_array(fp, allow_pickle=False)
    except ValueError as e:
        raise AmpError(f"{where} is not {kind} ({_first_line(e)})") from None
    except MemoryError:  # (a zip member's listed size can be false too)
        raise AmpError(f"{where} ({declared:,} bytes) does not fit in memory") from None


def _read_polygraphy_json(path: Path, origin: str) -> Iterator[dict[str, np.ndarray]]:
    """Polygraphy's ``--save-inputs`` format: a JSON list of {name: encoded ndarray}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AmpError(f"{origin}: not valid JSON ({e})") from None
    except RecursionError:
        raise AmpError(f"{origin}: JSON nested too deeply to be Polygraphy input data") from None
    except OSError as e:
        raise AmpError(f"{origin}: cannot be read ({e.strerror or _first_line(e)})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise AmpError(f"{origin}: expected a list of {{input name: array}} (Polygraphy input JSON)")
    for sample in data:
        yield {name: _decode_array(origin, name, enc) for name, enc in sample.items()}


def _decode_array(origin: str, name: str, encoded: object) -> np.ndarray:
    where = f"{origin}: input {name!r}"
    if not (isinstance(encoded, dict) and "array" in encoded):
        raise AmpError(f"{where} is not a Polygraphy-encoded array")
    try:
        raw = base64.b64decode(str(encoded["array"]).encode(), validate=True)
    except ValueError:  # (binascii.Error)
        raise AmpError(f"{where} is not a Polygraphy-encoded array (not base64)") from None
    return _read_npy(io.BytesIO(raw), len(raw), where, "a Polygraphy-encoded array")
