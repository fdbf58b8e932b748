"""Default lengths of generated inputs' dynamic dimensions: for token
inputs a prompt's length (DEFAULT_TOKENS) within the table their
positions index, split between new and past tokens where the model has a
KV cache; for float inputs an image's side (DEFAULT_IMAGE_SIDE) or a
sequence's length; and shorter ones tried where the fp32 model fails on
them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from .errors import AmpError
from .input_roles import InputRole
from .input_specs import InputSpec, is_float

if TYPE_CHECKING:
    from .inputs import InputSource

# Token inputs (ids, masks, positions: those input_roles gives a token role) span
# this many tokens along a dynamic sequence axis: a prompt's length, not 1,
# within the table their positions index. A model with a KV cache gets half
# as new tokens, half as past ones (its mask spans both).
DEFAULT_TOKENS = 128
# A float input's dynamic image axes (NCHW or NHWC, 1, 3 or 4 channels) are
# this long: a 1x1 image runs every Conv on padding and says nothing. Tried
# shorter, halving, down to MIN_IMAGE_SIDE.
DEFAULT_IMAGE_SIDE = 224
MIN_IMAGE_SIDE = 14
_CHANNELS = (1, 3, 4)
_CHANNEL_DIM = re.compile(r"chan|^c$", re.IGNORECASE)  # (a dynamic channel count: 3, an RGB image's)
# What a dynamic dimension's name says it is ("sum": "past_sequence_length + 1").
_BATCH_DIM = re.compile(r"batch|^[bn]$", re.IGNORECASE)
_PAST_DIM = re.compile(r"past|cache", re.IGNORECASE)
_TOTAL_DIM = re.compile(r"total|all_?seq|full_?seq|kv_?seq", re.IGNORECASE)


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
        """ "batch=1, seq=64, past_seq=64, total_seq=128", an unnamed one as
        "input[1]=256" (empty: every dynamic dimension is 1)."""
        named = [f"{name}={n}" for name, n in self.dims.items()]
        return ", ".join([*named, *(f"{name}[{axis}]={n}" for (name, axis), n in self.axes.items())])


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

    ``given``: the named dimensions ``input_shape`` settles (kept; a new or
    past one given sets the other, with a total). A positions input's
    values start after the past tokens. Dimensions of other inputs keep 1
    unless they share a name with these."""
    tokens_in = [s for s in specs if s.name in roles and roles[s.name].token]
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


def length_plans(specs: list[InputSpec], roles: dict[str, InputRole], given: dict[str, int]) -> Iterator[Lengths]:
    """The lengths to try, best first (see :func:`choose_lengths`):
    DEFAULT_TOKENS within the smallest table positions index, then (with a
    KV cache) one new token after the rest, then twice and four times as
    many (where no table bounds them: a model's own window may be longer,
    as Silero VAD's 16 kHz branch is), then half as many, down to 2; last
    every dynamic dimension at 1 (the choice before there were defaults).
    Only that last where nothing is to choose."""
    rows = [r.rows for r in roles.values() if r.kind == "positions" and r.rows]
    tokens, side = min([DEFAULT_TOKENS, *rows]), DEFAULT_IMAGE_SIDE

    def plan(n: int, side: int, new: int | None = None) -> Lengths:
        return with_float_lengths(choose_lengths(specs, roles, given, n, new), specs, given, n, side)

    first = plan(tokens, side)
    if first.dims or first.axes:
        yield first
        tried = [(first.dims, first.axes)]
        if first.past and tokens > 2:
            yield plan(tokens, side, new=1)
        others = [plan(tokens * k, side) for k in (2, 4)] if not rows else []
        while tokens > 2 or side > MIN_IMAGE_SIDE:
            tokens, side = (tokens // 2 if tokens > 2 else tokens), (side // 2 if side > MIN_IMAGE_SIDE else side)
            others.append(plan(tokens, side))
        for lengths in others:
            if (lengths.dims, lengths.axes) not in tried:
                tried.append((lengths.dims, lengths.axes))
                yield lengths
    yield Lengths()


def with_float_lengths(lengths: Lengths, specs: list[InputSpec], given: dict[str, int], tokens: int, side: int) -> Lengths:
    """``lengths`` with the dynamic dimensions of float inputs that neither
    it nor ``given`` (the names --input-shape settles) sets:

    * an image's (rank 4, 1, 3 or 4 channels on axis 1 or 3, or a dimension
      named for them, which is 3) height and width are ``side``;
    * a batch (its name says so, or the first dynamic axis of two or more)
      is 1;
    * any other (a sequence, a time axis, a waveform's samples) is ``tokens``.

    A name shared by several axes gets the first value it is given."""
    dims, axes = dict(lengths.dims), dict(lengths.axes)
    tokens_too = bool(lengths.dims or lengths.axes)
    for spec in specs:
        if not is_float(spec.dtype) or any(name == spec.name for name, _ in lengths.axes):
            continue
        shape = spec.shape
        dynamic = [k for k, d in enumerate(shape) if not isinstance(d, int)]
        if any(d in dims or d in given for d in shape if isinstance(d, str)):
            continue  # (a KV cache, or an input that shares a token input's or the user's dimensions)
        image = _image_axes(shape, tokens_too)
        for k in dynamic:
            d = shape[k]
            if isinstance(d, str) and _CHANNEL_DIM.search(d):
                dims.setdefault(d, 3)
                continue
            kind = _dim_kind(d) if isinstance(d, str) else "new"
            if kind == "new" and k == dynamic[0] and len(shape) >= 2 and k not in image:
                kind = "batch"
            if kind in ("batch", "past", "total", "sum") and k not in image:
                continue
            n = side if k in image else tokens
            if isinstance(d, str):
                dims.setdefault(d, n)
            else:
                axes[(spec.name, k)] = n
    return Lengths(dims, axes, lengths.starts, lengths.past)


def _image_axes(shape: tuple, tokens_too: bool = False) -> tuple[int, ...]:
    """The height and width axes of an image input's ``shape`` (NCHW, else
    NHWC; channels 1, 3 or 4, or a dimension named for them), or ().
    ``tokens_too``: the model has token inputs, where a float input of one
    channel is an attention mask or bias (batch, 1, seq, seq), not an image."""
    if len(shape) != 4:
        return ()
    channels = (3, 4) if tokens_too else _CHANNELS

    def is_channels(d) -> bool:
        return d in channels or (isinstance(d, str) and bool(_CHANNEL_DIM.search(d)))

    if is_channels(shape[1]) and not (isinstance(shape[2], int) and isinstance(shape[3], int)):
        return (2, 3)
    if is_channels(shape[3]) and not (isinstance(shape[1], int) and isinstance(shape[2], int)):
        return (1, 2)
    return ()


def pick_running_lengths(model: onnx.ModelProto, source: InputSource, plans: list[Lengths]) -> None:
    """Set ``source.lengths`` to the first of ``plans`` the fp32 model runs
    on (onnxruntime's CPU provider; one sample, or one per value of a branch
    input: each branch must run), the last (every dimension 1, not tried)
    where none does; the first failure goes in its note. A model that does
    not load, or whose tensors are in external files (not read here), keeps
    the first."""
    from .emulate import detect_low_dtype
    from .external import has_external
    from .runner import runnable

    if has_external(model):
        return
    failed = ""
    session = None
    branches = max([1, *(len(r.values) for r in source.roles.values() if r.kind == "branch")])
    for plan in plans[:-1]:
        source.lengths = plan
        try:
            samples = list(itertools.islice(source, branches))
        except AmpError:  # (a range that holds no value: the run that validates says so)
            return
        if session is None:
            try:
                session = runnable(model, detect_low_dtype(model), "cpu", "auto", (), None, "reference")
            except AmpError:
                source.lengths = plans[0]
                return  # (it does not load: the run that validates says why)
        try:
            for feeds in samples:
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
