"""Conversion options: one validated value object shared by the API, the CLI
and config files."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError
from .lists import BATCHNORM, LEVELS, PROFILES, OpLists
from .op_profiles import resolve_lists

if TYPE_CHECKING:  # (onnx and ml_dtypes load where an option is checked: --help needs neither)
    from .dtypes import LowDtype

IO_TYPES = ("keep", "low")
PROVIDERS = ("auto", "cuda", "cpu")  # onnxruntime providers validation can ask for (auto: CUDA where usable)
TARGET_PROVIDERS = ("cuda", "cpu", "none")  # providers a conversion can be aimed at (none: any kernel will do)
EMULATE_MODES = ("auto", "always", "never")  # when validation runs an fp32 twin that rounds as the low model does
ERROR_STATS = ("max", "mean", "median", "quantile")  # statistics of an output's absolute errors a verdict can judge


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides how a model is converted.

    ``level`` None means O2, or O1 when ``only_white_list`` is given
    (MindSpore's ``custom_mixed_precision`` with a white list behaves as O1,
    with a black list as O2).
    """

    level: str | None = None
    dtype: str = "fp16"
    lists: str = "default"
    white_list: tuple[str, ...] = ()
    black_list: tuple[str, ...] = ()
    only_white_list: tuple[str, ...] | None = None
    only_black_list: tuple[str, ...] | None = None
    keep_fp32: tuple[str, ...] = ()  # node-name regexes
    force_low: tuple[str, ...] = ()
    keep_batchnorm_fp32: bool | None = None
    # A BatchNormalization the level keeps fp32 is folded, in fp32, into the Conv before it (fold.py).
    fold_batchnorm: bool = True
    io_types: str = "keep"
    # Safety rules: None = on at O1/O2 (and auto), off at O3 ("everything").
    safety: bool | None = None
    initializer_range: bool = True  # out-of-range constants keep their consumer fp32
    clip_initializers: bool = False  # ... or are clipped to the low dtype's range instead (counted)
    data_max: float | None = None  # calibrated rule: |values| in the fp32 run above this keep a node fp32
    target_opset: int | None = None  # upgrade the default-domain opset first (one below the model's is refused)
    # The execution provider the model is meant to run on: a node runs low only where it has a kernel for
    # that op in the low dtype ('cuda', 'cpu', or 'none' for no filtering).
    target_provider: str = "cuda"
    keep_fp32_nodes: tuple[str, ...] = ()  # exact node names (the auto search sets these)
    force_low_nodes: tuple[str, ...] = ()
    _compiled: dict[str, tuple[re.Pattern[str], ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def effective_level(self) -> str:
        if self.level is not None:
            return self.level
        return "O1" if self.only_white_list is not None else "O2"

    @property
    def low(self) -> LowDtype:
        from .dtypes import low_dtype

        return low_dtype(self.dtype)

    @property
    def safety_on(self) -> bool:
        return self.safety if self.safety is not None else self.effective_level in ("O1", "O2")

    @property
    def effective_data_max(self) -> float:
        """Default: half the low dtype's max (headroom for values the samples missed)."""
        return self.data_max if self.data_max is not None else self.low.max / 2

    def validated(self) -> ConvertOptions:
        """A normalised copy; raises UsageError naming the field on bad values."""
        level = self.level
        if level is not None:
            level = str(level).upper()
            if level not in LEVELS:
                raise UsageError(f"unknown `level` {self.level!r}: use one of {', '.join(LEVELS)}", "level")
        try:
            dtype = self.low.key
        except ValueError as e:
            raise UsageError(f"`dtype`: {e}", "dtype") from None
        if self.lists not in PROFILES:
            raise UsageError(f"unknown list profile {self.lists!r} (`lists`): use one of {', '.join(PROFILES)}", "lists")
        if self.io_types not in IO_TYPES:
            raise UsageError(f"unknown `io_types` {self.io_types!r}: use 'keep' or 'low'", "io_types")
        if self.data_max is not None and not 0 < self.data_max < math.inf:  # (NaN fails too)
            raise UsageError(f"`data_max` must be a finite number > 0, got {self.data_max!r}", "data_max")
        if self.target_opset is not None and (
            not isinstance(self.target_opset, int) or isinstance(self.target_opset, bool) or self.target_opset < 1
        ):
            raise UsageError(f"`target_opset` must be a positive integer, got {self.target_opset!r}", "target_opset")
        if self.target_provider not in TARGET_PROVIDERS:
            raise UsageError(
                f"unknown `target_provider` {self.target_provider!r}: use one of {', '.join(TARGET_PROVIDERS)}",
                "target_provider",
            )
        if self.only_white_list is not None and self.only_black_list is not None:
            raise UsageError("give `only_white_list` or `only_black_list`, not both", "only_white_list")
        if self.only_white_list is not None and level not in (None, "O1"):
            raise UsageError(
                f"`only_white_list` converts as O1 (only the listed ops run low); it cannot be used with `level` {level}",
                "only_white_list",
            )
        if self.only_black_list is not None and level not in (None, "O2"):
            raise UsageError(
                f"`only_black_list` converts as O2 (all but the listed ops run low); it cannot be used with `level` {level}",
                "only_black_list",
            )
        from .schema import validate_op_names

        normalised = replace(
            self,
            level=level,
            dtype=dtype,
            white_list=tuple(validate_op_names(self.white_list, "white_list")),
            black_list=tuple(validate_op_names(self.black_list, "black_list")),
            only_white_list=None
            if self.only_white_list is None
            else tuple(validate_op_names(self.only_white_list, "only_white_list")),
            only_black_list=None
            if self.only_black_list is None
            else tuple(validate_op_names(self.only_black_list, "only_black_list")),
            _compiled={
                "keep_fp32": _compile(self.keep_fp32, "keep_fp32"),
                "force_low": _compile(self.force_low, "force_low"),
            },
        )
        # An op both white and black is a contradiction whichever flags say it (the only-lists replace the built-in
        # lists, not what the user adds to them).
        whites = (("white_list", normalised.white_list), ("only_white_list", normalised.only_white_list or ()))
        blacks = (("black_list", normalised.black_list), ("only_black_list", normalised.only_black_list or ()))
        for white_flag, white in whites:
            for black_flag, black in blacks:
                both = sorted(set(white) & set(black))
                if both:
                    raise UsageError(f"op type(s) in both `{white_flag}` and `{black_flag}`: {', '.join(both)}", white_flag)
        if self.keep_batchnorm_fp32 is False and BATCHNORM in (normalised.only_black_list or ()):
            raise UsageError(
                f"{BATCHNORM} is on `only_black_list`, and `keep_batchnorm_fp32` false runs it low: give one",
                "keep_batchnorm_fp32",
            )
        return normalised

    def auto_start(self, auto_from: str | None) -> str:
        """The level ``--level auto`` starts from: ``auto_from``, else the level an only-list
        converts as (a search at any other level would drop the list), else O3."""
        flag, implied = "", None
        if self.only_white_list is not None:
            flag, implied = "only_white_list", "O1"
        elif self.only_black_list is not None:
            flag, implied = "only_black_list", "O2"
        if implied is not None and auto_from not in (None, implied):
            raise UsageError(
                f"`{flag}` converts as {implied}: with `level` auto it cannot be used with `auto_from` {auto_from}", flag
            )
        return auto_from or implied or "O3"

    def op_lists(self) -> OpLists:
        return resolve_lists(
            self.lists,
            self.effective_level,
            self.dtype,
            white_list=self.white_list,
            black_list=self.black_list,
            only_white_list=self.only_white_list,
            only_black_list=self.only_black_list,
            keep_batchnorm_fp32=self.keep_batchnorm_fp32,
        )

    def patterns(self, which: str) -> tuple[re.Pattern[str], ...]:
        if which not in self._compiled:
            return _compile(getattr(self, which), which)
        return self._compiled[which]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for reports and plans)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name.startswith("_"):
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["level"] = self.effective_level
        return out


def _compile(patterns: tuple[str, ...], flag: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise UsageError(f"`{flag}`: invalid regular expression {p!r}: {e}", flag) from None
    return tuple(compiled)


EXTERNAL_DATA = ("auto", "always", "never")
AUTO_STARTS = ("O1", "O2")


@dataclass(frozen=True)
class ValidationOptions:
    """How a converted model is checked against its fp32 original.

    Inputs: ``inputs`` (.npz files, folders of them, Polygraphy input JSON),
    else generated samples (``samples`` of them, from ``seed``), shaped by
    ``input_shape`` (``"NAME=DIMS"``) and ranged by ``input_range``
    (``"NAME=LOW:HIGH"``). ``calibration``: samples for the calibrated
    safety rule (default: the validation inputs).
    Verdict: ``atol``, ``rtol``, ``min_cosine`` and ``min_top1`` over the
    low dtype's defaults (None: the default); ``check_error_stat``: the
    statistic of the absolute errors held to the limit (ERROR_STATS; None:
    max), ``error_quantile`` the one ``quantile`` judges (in (0, 1]; None:
    0.99); ``tolerance``: per output,
    ``"NAME:atol=..,rtol=.."`` strings or a mapping ``{NAME: {"atol": ..}}``.
    Diagnosis: ``per_node`` (None: on up to 20,000 tensors), ``top``
    offenders, ``pin_choices``. Runtime: ``provider`` (auto, cuda, cpu),
    ``emulate`` (auto, always, never).
    """

    provider: str = "auto"
    emulate: str = "auto"
    inputs: tuple[str, ...] = ()
    input_shape: tuple[str, ...] = ()
    input_range: tuple[str, ...] = ()
    samples: int = 2
    seed: int = 0
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    check_error_stat: str | None = None
    error_quantile: float | None = None
    tolerance: tuple[str, ...] | Mapping[str, Mapping[str, float]] = ()
    per_node: bool | None = None
    pin_choices: bool = True
    top: int = 10
    calibration: tuple[str, ...] = ()

    @property
    def inputs_given(self) -> bool:
        """Whether any input option was given (else the generated inputs are announced)."""
        return bool(self.inputs or self.input_shape or self.input_range)

    def validated(self) -> ValidationOptions:
        """A normalised copy; raises UsageError naming the field on bad values."""
        if self.provider not in PROVIDERS:
            raise UsageError(f"unknown `provider` {self.provider!r}: use one of {', '.join(PROVIDERS)}", "provider")
        if self.emulate not in EMULATE_MODES:
            raise UsageError(f"unknown `emulate` mode {self.emulate!r}: use one of {', '.join(EMULATE_MODES)}", "emulate")
        for name, least, most in (("atol", 0, math.inf), ("rtol", 0, math.inf), ("min_cosine", -1, 1), ("min_top1", 0, 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not _finite_in(value, least, most)):
                span = f">= {least:g}" if math.isinf(most) else f"in [{least:g}, {most:g}]"
                raise UsageError(f"`{name}` must be a finite number {span}, got {value!r}", name)
        self._check_error_stat()
        for name, least in (("samples", 1), ("seed", 0), ("top", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UsageError(f"`{name}` must be an integer >= {least}, got {value!r}", name)
        return replace(
            self,
            inputs=_strings(self.inputs, "inputs"),
            input_shape=_strings(self.input_shape, "input_shape"),
            input_range=_strings(self.input_range, "input_range"),
            calibration=_strings(self.calibration, "calibration"),
            tolerance=self.tolerance if isinstance(self.tolerance, Mapping) else _strings(self.tolerance, "tolerance"),
        )

    def _check_error_stat(self) -> None:
        stat, q = self.check_error_stat, self.error_quantile
        if stat is not None and stat not in ERROR_STATS:
            raise UsageError(f"unknown `check_error_stat` {stat!r}: use one of {', '.join(ERROR_STATS)}", "check_error_stat")
        if q is None:
            return
        if isinstance(q, bool) or not _finite_in(q, 0, 1) or q == 0:
            raise UsageError(f"`error_quantile` must be a number in (0, 1], got {q!r}", "error_quantile")
        if stat != "quantile":
            raise UsageError(
                f"`error_quantile` applies to `check_error_stat` quantile only (the statistic is {stat or 'max'})",
                "error_quantile",
            )


@dataclass(frozen=True)
class AutoOptions:
    """The ``level="auto"`` search: at most ``max_trials`` conversions and
    validations, shrinking from O3 or growing from ``auto_from`` (O1, O2)."""

    max_trials: int = 8
    auto_from: str | None = None

    def validated(self) -> AutoOptions:
        """This, checked; raises UsageError naming the field on bad values."""
        if not isinstance(self.max_trials, int) or isinstance(self.max_trials, bool) or not 1 <= self.max_trials <= 1000:
            raise UsageError(f"`max_trials` must be an integer in [1, 1000], got {self.max_trials!r}", "max_trials")
        if self.auto_from not in (None, *AUTO_STARTS):
            raise UsageError(f"`auto_from` must be O1 or O2, got {self.auto_from!r}", "auto_from")
        return self


@dataclass(frozen=True)
class OutputOptions:
    """What a run from a file writes: the model (``output``; None: beside
    the input with a .fp16/.bf16 suffix), its external data (``external_data``:
    auto when the input had any or the result is over 2 GB, always, never),
    whether a model out of tolerance is written (``write_on_fail``), and the
    plan and report files asked for (None: not written)."""

    output: Path | None = None
    external_data: str = "auto"
    write_on_fail: bool = False
    plan_json: Path | None = None
    report: Path | None = None
    html: Path | None = None

    def validated(self) -> OutputOptions:
        """This, with paths as Paths; raises UsageError naming the field on bad values."""
        if self.external_data not in EXTERNAL_DATA:
            raise UsageError(
                f"unknown `external_data` {self.external_data!r}: use one of {', '.join(EXTERNAL_DATA)}", "external_data"
            )
        paths = {
            k: None if getattr(self, k) is None else Path(getattr(self, k)) for k in ("output", "plan_json", "report", "html")
        }
        return replace(self, **paths)


def with_fields(options, given: Mapping[str, Any]):
    """``options`` (an options dataclass) with the fields ``given`` as
    keywords; an unknown field is a UsageError naming it."""
    unknown = sorted(set(given) - {f.name for f in fields(options)})
    if unknown:
        raise UsageError(f"unknown option `{unknown[0]}` for {type(options).__name__}", unknown[0])
    return replace(options, **given) if given else options


def _finite_in(value: object, least: float, most: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and least <= value <= most


def _strings(values: object, name: str) -> tuple[str, ...]:
    """``values`` as a tuple of strings (one string or path is one entry)."""
    if isinstance(values, (str, os.PathLike)):
        values = (values,)
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (str, os.PathLike)) for v in values):
        raise UsageError(f"`{name}` must be a list of strings, got {values!r}", name)
    return tuple(os.fspath(v) for v in values)
