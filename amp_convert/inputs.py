"""Validation inputs: .npz files, folders of them, Polygraphy input JSON, or
generated random samples; all checked against the model's inputs.

Samples are produced lazily, one at a time, so validation can stream them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx

from .errors import AmpError
from .input_roles import InputRole, input_roles
from .input_specs import InputSpec, check_given, input_specs, is_float, parse_ranges, parse_shapes, shape_text
from .sample_files import expand_files, read_samples
from .token_lengths import Lengths, length_plans, pick_running_lengths

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
# Integer inputs are often indices (token types, positions): stay at 0/1 unless told.
DEFAULT_INT_RANGE = (0, 2)
# A generated input of more elements is refused before anything is allocated
# (2**31 float32 values are 8 GiB, per sample).
MAX_GENERATED_ELEMENTS = 2**31


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
    option: str = "inputs"  # the field the files came from (inputs, calibration), for messages
    dynamic: list[str] = field(default_factory=list)  # generated inputs with dynamic dimensions no option set
    roles: dict[str, InputRole] = field(default_factory=dict)  # integer inputs' roles (input_roles.py), for generating them
    # The default lengths of dynamic dimensions no option sets (see choose_lengths; the rest are 1)
    lengths: Lengths = field(default_factory=lambda: Lengths())

    def failure_hint(self) -> str:
        """What to try when a model fails to run on these samples: files are
        the user's own; generated ones follow what the options said, 1 for a
        dimension they did not, values in a default range."""
        if self.files:
            return f" (on the samples of `{self.option}`)"
        if self.dynamic:
            return (
                f" (on generated inputs: the dynamic dimensions of {', '.join(self.dynamic)} were set to "
                f"{self.lengths.text() or '1'}; "
                "give real shapes with `input_shape` NAME=DIMS (and value ranges with `input_range` NAME=LOW:HIGH), "
                "or samples with `inputs`)"
            )
        return " (on generated random inputs: give value ranges with `input_range` NAME=LOW:HIGH, or samples with `inputs`)"

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
                values, why = f"[{low:g}, {high:g})", "`input_range`"
            elif role is not None and role.kind == "mask":
                values, why = "ones", f"a mask: {role.why}"
            elif role is not None and role.kind == "positions":
                first = self.lengths.starts.get(spec.name, 0)
                values, why = ", ".join(str(first + k) for k in range(3)) + ", ...", f"positions: {role.why}"
                if first:
                    why += f"; after {first} past tokens"
            elif role is not None and role.kind == "index" and spec.dtype != np.bool_:
                values, why = f"[0, {role.rows})", f"an index: {role.why}"
            elif role is not None and role.kind == "branch":
                values, why = ", ".join(map(str, role.values)) + " (one per sample)", role.why
                if self.samples < len(role.values):
                    why += f"; {self.samples} sample(s) run the first {self.samples} (`samples` runs more)"
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
        how = f" ({dims}; `input_shape` sets them)" if dims else ""
        note = f" ({self.lengths.note})" if self.lengths.note else ""
        return f"inputs: {self.samples} generated sample(s){how}: " + "; ".join(parts) + note

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.files:
            yield from self._file_samples()
        else:
            rng = np.random.default_rng(self.seed)
            for k in range(self.samples):
                yield {s.name: self._random(s, rng, k) for s in self.specs}

    def _file_samples(self) -> Iterator[dict[str, np.ndarray]]:
        """The files' samples, checked; files that hold none (a Polygraphy ``[]``) are refused
        naming the option and the files: a run over no sample would judge nothing."""
        read = 0
        for path in self.files:
            origin = f"`{self.option}` {path}"
            for sample in read_samples(path, origin):
                read += 1
                yield self.check(sample, origin)
        if not read:
            purpose = "calibration" if self.option == "calibration" else "validation"
            raise AmpError(f"no {purpose} samples in `{self.option}` {', '.join(map(str, self.files))}")

    def count(self) -> int | None:
        """Number of samples when known without reading the files."""
        if not self.files:
            return self.samples
        if all(p.suffix == ".npz" for p in self.files):
            return len(self.files)
        return None

    def _named_dims(self) -> dict[str, int]:
        """Symbolic dimensions fixed by ``input_shape``, for the other inputs that
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
        """The shape of ``spec``'s random samples: ``input_shape``, else the model's
        dims with symbolic ones shared with another input's ``input_shape``, else
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

    def _random(self, spec: InputSpec, rng: np.random.Generator, k: int) -> np.ndarray:
        """Sample ``k``'s value of ``spec``."""
        shape = self.generated_shape(spec)
        role = self.roles.get(spec.name) if spec.name not in self.ranges else None
        if role is not None and role.kind == "mask":
            return np.ones(shape, dtype=spec.dtype)
        if role is not None and role.kind == "branch":
            return np.full(shape, role.values[k % len(role.values)], dtype=spec.dtype)
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
                    f"`input_range` {spec.name}={low:g}:{high:g}: holds no {spec.dtype} value, "
                    f"or goes beyond {spec.dtype}'s [{info.min}, {info.max}]"
                )
            return rng.integers(first, end, size=shape, dtype=np.int64 if info.max < 2**63 else np.uint64).astype(spec.dtype)
        if is_float(spec.dtype):
            low, high = self.ranges.get(spec.name, DEFAULT_FLOAT_RANGE)
            if max(abs(low), abs(high)) > float(ml_dtypes.finfo(spec.dtype).max):
                raise AmpError(f"`input_range` {spec.name}={low:g}:{high:g}: beyond {spec.dtype}'s range")
            return rng.uniform(low, high, size=shape).astype(np.float32).astype(spec.dtype)
        raise AmpError(f"input {spec.name!r}: cannot generate random {spec.dtype} data; give `inputs`")

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
                    f"{shape_text(spec.shape)}"
                )
            for got, want in zip(array.shape, spec.shape, strict=False):
                if isinstance(want, int) and got != want:
                    raise AmpError(
                        f"{origin}: input {name!r} has shape {list(array.shape)}, the model expects {shape_text(spec.shape)}"
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
            if ref.dtype != cand.dtype and not (is_float(ref.dtype) and is_float(cand.dtype)):
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
                    f"the models' inputs differ: {name!r} is {shape_text(ref.shape)} in the reference, "
                    f"{shape_text(spec.shape)} in the candidate, which does not take a sample of shape {list(shape)}"
                    + (" (give `inputs` or `input_shape` that fit both)" if both else "")
                )


def make_source(
    model: onnx.ModelProto,
    inputs: Sequence[str | Path] = (),
    shapes: Sequence[str] = (),
    ranges: Sequence[str] = (),
    samples: int = 2,
    seed: int = 0,
    option: str = "inputs",
    try_lengths: bool = True,
) -> InputSource:
    """Build an input source; names in shapes/ranges are checked here.
    ``option`` is the field ``inputs`` came from (``inputs`` or ``calibration``: named in messages).

    Generated token inputs get a sequence of up to DEFAULT_TOKENS along a
    dynamic axis no option sets (:func:`choose_lengths`); with
    ``try_lengths``, the fp32 ``model`` runs once in onnxruntime (CPU) on
    a sample of them, shorter ones are tried where it fails, and where all
    fail every such dimension is 1, as it was (the note says so). Not tried
    for a model whose tensors are in external files."""
    specs = input_specs(model)
    shape_map, range_map = parse_shapes(shapes), parse_ranges(ranges)
    check_given(specs, shape_map, range_map)
    if samples < 1:
        raise AmpError("`samples` must be at least 1")
    if seed < 0:
        raise AmpError(f"`seed` must be 0 or more, got {seed}")
    files = expand_files(inputs, option)
    source = InputSource(specs, files, shape_map, range_map, samples, seed, option=option)
    if not files:
        source.roles = input_roles(model)
        plans = list(length_plans(specs, source.roles, source._named_dims()))
        plans = [p for p in plans[:-1] if _fits(source, p)] + plans[-1:]  # (the last, every dimension 1, as ever)
        source.lengths = plans[0]
        if try_lengths and len(plans) > 1:
            pick_running_lengths(model, source, plans)
        for spec in specs:
            shape = source.generated_shape(spec)
            if math.prod(shape) > MAX_GENERATED_ELEMENTS:
                raise AmpError(
                    f"input {spec.name!r}: a generated sample of shape {list(shape)} would hold {math.prod(shape):,} "
                    f"elements, more than {MAX_GENERATED_ELEMENTS:,}; give a smaller `input_shape`, or samples with `inputs`"
                )
        named = source._named_dims()  # (a symbolic dimension another input's input_shape settles is not 1)
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
            source.notes.append(f"dynamic dimensions of {', '.join(dynamic)} set to {set_to} (use `input_shape`)")
        if source.lengths.note:
            source.notes.append(source.lengths.note)
    return source


def _fits(source: InputSource, lengths: Lengths) -> bool:
    """Whether every generated input holds at most MAX_GENERATED_ELEMENTS with ``lengths``."""
    held, source.lengths = source.lengths, lengths
    try:
        return all(math.prod(source.generated_shape(s)) <= MAX_GENERATED_ELEMENTS for s in source.specs)
    finally:
        source.lengths = held


def check_unused(
    model: onnx.ModelProto,
    files: Sequence[str | Path] = (),
    option: str = "inputs",
    shapes: Sequence[str] = (),
    ranges: Sequence[str] = (),
) -> None:
    """Vet sample options a run will not read (``validate`` false, or ``calibration`` with the
    safety rules off) as :func:`make_source` would: a file that is not there, or a name
    that is no input of the model, is a mistake whether or not the run reads it."""
    expand_files(files, option)
    if shapes or ranges:
        check_given(input_specs(model), parse_shapes(shapes), parse_ranges(ranges))
