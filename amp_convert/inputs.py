"""Validation inputs: .npz files, folders of them, Polygraphy input JSON, or
generated random samples; all checked against the model's inputs.

Samples are produced lazily, one at a time, so validation can stream them.
"""

from __future__ import annotations

import base64
import io
import json
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from .errors import AmpError

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
# Integer inputs are often indices (token types, positions): stay at 0/1 unless told.
DEFAULT_INT_RANGE = (0, 2)


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
class InputSource:
    """Where validation samples come from (described in the report)."""

    specs: list[InputSpec]
    files: list[Path] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: int = 2
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        if self.files:
            return {"kind": "files", "files": [str(f) for f in self.files], "notes": self.notes}
        return {
            "kind": "random",
            "samples": self.samples,
            "seed": self.seed,
            "shapes": {n: list(s) for n, s in self.shapes.items()},
            "ranges": {n: list(r) for n, r in self.ranges.items()},
            "notes": self.notes,
        }

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.files:
            for path in self.files:
                for sample in _read_samples(path):
                    yield self.check(sample, str(path))
        else:
            rng = np.random.default_rng(self.seed)
            for _ in range(self.samples):
                yield {s.name: self._random(s, rng) for s in self.specs}

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

    def _random(self, spec: InputSpec, rng: np.random.Generator) -> np.ndarray:
        named = self._named_dims()
        shape = self.shapes.get(spec.name) or tuple(d if isinstance(d, int) else named.get(d, 1) for d in spec.shape)
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
        if np.issubdtype(spec.dtype, np.floating) or spec.dtype == np.dtype(ml_dtypes.bfloat16):  # (bf16: ml_dtypes)
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
) -> InputSource:
    """Build an input source; names in shapes/ranges are checked here."""
    specs = input_specs(model)
    names = {s.name for s in specs}
    shape_map, range_map = parse_shapes(shapes), parse_ranges(ranges)
    for flag, given in (("--input-shape", shape_map), ("--input-range", range_map)):
        for name in given:
            if name not in names:
                raise AmpError(f"{flag}: {name!r} is not an input of the model (inputs: {', '.join(sorted(names))})")
    for spec in specs:
        if spec.name in shape_map:
            shape = shape_map[spec.name]
            if spec.ranked and len(shape) != len(spec.shape):
                raise AmpError(f"--input-shape {spec.name}: rank {len(shape)}, the model expects {_shape_text(spec.shape)}")
            for got, want in zip(shape, spec.shape, strict=False):
                if isinstance(want, int) and got != want:
                    raise AmpError(f"--input-shape {spec.name}: {list(shape)} does not fit {_shape_text(spec.shape)}")
    if samples < 1:
        raise AmpError("--samples must be at least 1")
    files = _expand_files(inputs)
    source = InputSource(specs, files, shape_map, range_map, samples, seed)
    if not files:
        dynamic = [s.name for s in specs if s.name not in shape_map and any(not isinstance(d, int) for d in s.shape)]
        if dynamic:
            source.notes.append(f"dynamic dimensions of {', '.join(dynamic)} set to 1 (use --input-shape)")
    return source


def _expand_files(inputs: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise AmpError(f"--inputs {p}: the folder holds no .npz files")
            files.extend(found)
        elif p.is_file():
            if p.suffix not in (".npz", ".json"):
                raise AmpError(f"--inputs {p}: expected a .npz file, a folder of them, or a Polygraphy .json")
            files.append(p)
        else:
            raise AmpError(f"--inputs {p}: no such file or folder")
    return files


def _read_samples(path: Path) -> Iterator[dict[str, np.ndarray]]:
    if path.suffix == ".npz":
        yield _read_npz(path)
    else:
        yield from _read_polygraphy_json(path)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise AmpError(f"{path}: holds object arrays (pickled Python objects), refused; save plain numeric arrays") from None
        raise AmpError(f"{path}: not a readable .npz file ({str(e).splitlines()[0]})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise AmpError(f"{path}: not a readable .npz file ({str(e).splitlines()[0] or type(e).__name__})") from None


def _read_polygraphy_json(path: Path) -> Iterator[dict[str, np.ndarray]]:
    """Polygraphy's ``--save-inputs`` format: a JSON list of {name: encoded ndarray}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AmpError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise AmpError(f"{path}: expected a list of {{input name: array}} (Polygraphy input JSON)")
    for sample in data:
        yield {name: _decode_array(path, name, enc) for name, enc in sample.items()}


def _decode_array(path: Path, name: str, encoded: object) -> np.ndarray:
    if isinstance(encoded, dict) and "array" in encoded:
        try:
            raw = base64.b64decode(str(encoded["array"]).encode(), validate=True)
            array = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:  # (EOFError: an empty or truncated array)
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AmpError(f"{path}: input {name!r} is not a Polygraphy-encoded array ({detail})") from None
        if isinstance(array, np.ndarray):
            return array
    raise AmpError(f"{path}: input {name!r} is not a Polygraphy-encoded array")
