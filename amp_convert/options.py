"""Conversion options: one validated value object shared by the API, the CLI
and config files."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .dtypes import LowDtype, low_dtype
from .errors import AmpError
from .lists import BATCHNORM, LEVELS, PROFILES, OpLists, resolve_lists
from .schema import validate_op_names

IO_TYPES = ("keep", "low")
PROVIDERS = ("auto", "cuda", "cpu")  # onnxruntime providers validation can ask for (auto: CUDA where usable)
TARGET_PROVIDERS = ("cuda", "cpu", "none")  # providers a conversion can be aimed at (none: any kernel will do)


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
        return low_dtype(self.dtype)

    @property
    def safety_on(self) -> bool:
        return self.safety if self.safety is not None else self.effective_level in ("O1", "O2")

    @property
    def effective_data_max(self) -> float:
        """Default: half the low dtype's max (headroom for values the samples missed)."""
        return self.data_max if self.data_max is not None else self.low.max / 2

    def validated(self) -> ConvertOptions:
        """A normalised copy; raises AmpError (usage error) on bad values."""
        level = self.level
        if level is not None:
            level = str(level).upper()
            if level not in LEVELS:
                raise AmpError(f"unknown level {self.level!r}: use one of {', '.join(LEVELS)}")
        try:
            dtype = low_dtype(self.dtype).key
        except ValueError as e:
            raise AmpError(str(e)) from None
        if self.lists not in PROFILES:
            raise AmpError(f"unknown list profile {self.lists!r}: use one of {', '.join(PROFILES)}")
        if self.io_types not in IO_TYPES:
            raise AmpError(f"unknown io types {self.io_types!r}: use 'keep' or 'low'")
        if self.data_max is not None and not 0 < self.data_max < math.inf:  # (NaN fails too)
            raise AmpError(f"--data-max must be a finite number > 0, got {self.data_max!r}")
        if self.target_opset is not None and (
            not isinstance(self.target_opset, int) or isinstance(self.target_opset, bool) or self.target_opset < 1
        ):
            raise AmpError(f"--target-opset must be a positive integer, got {self.target_opset!r}")
        if self.target_provider not in TARGET_PROVIDERS:
            raise AmpError(f"unknown target provider {self.target_provider!r}: use one of {', '.join(TARGET_PROVIDERS)}")
        if self.only_white_list is not None and self.only_black_list is not None:
            raise AmpError("give --only-white-list or --only-black-list, not both")
        if self.only_white_list is not None and level not in (None, "O1"):
            raise AmpError(
                f"--only-white-list converts as O1 (only the listed ops run low); it cannot be used with --level {level}"
            )
        if self.only_black_list is not None and level not in (None, "O2"):
            raise AmpError(
                f"--only-black-list converts as O2 (all but the listed ops run low); it cannot be used with --level {level}"
            )
        normalised = replace(
            self,
            level=level,
            dtype=dtype,
            white_list=tuple(validate_op_names(self.white_list, "--white-list")),
            black_list=tuple(validate_op_names(self.black_list, "--black-list")),
            only_white_list=None
            if self.only_white_list is None
            else tuple(validate_op_names(self.only_white_list, "--only-white-list")),
            only_black_list=None
            if self.only_black_list is None
            else tuple(validate_op_names(self.only_black_list, "--only-black-list")),
            _compiled={
                "keep_fp32": _compile(self.keep_fp32, "--keep-fp32"),
                "force_low": _compile(self.force_low, "--force-low"),
            },
        )
        # An op both white and black is a contradiction whichever flags say it (the only-lists replace the built-in
        # lists, not what the user adds to them).
        whites = (("--white-list", normalised.white_list), ("--only-white-list", normalised.only_white_list or ()))
        blacks = (("--black-list", normalised.black_list), ("--only-black-list", normalised.only_black_list or ()))
        for white_flag, white in whites:
            for black_flag, black in blacks:
                both = sorted(set(white) & set(black))
                if both:
                    raise AmpError(f"op type(s) in both {white_flag} and {black_flag}: {', '.join(both)}")
        if self.keep_batchnorm_fp32 is False and BATCHNORM in (normalised.only_black_list or ()):
            raise AmpError(f"{BATCHNORM} is on --only-black-list, and --no-keep-batchnorm-fp32 runs it low: give one")
        return normalised

    def auto_start(self, auto_from: str | None) -> str:
        """The level ``--level auto`` starts from: ``auto_from``, else the level an only-list
        converts as (a search at any other level would drop the list), else O3."""
        flag, implied = "", None
        if self.only_white_list is not None:
            flag, implied = "--only-white-list", "O1"
        elif self.only_black_list is not None:
            flag, implied = "--only-black-list", "O2"
        if implied is not None and auto_from not in (None, implied):
            raise AmpError(f"{flag} converts as {implied}: with --level auto it cannot be used with --auto-from {auto_from}")
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
            raise AmpError(f"{flag}: invalid regular expression {p!r}: {e}") from None
    return tuple(compiled)
