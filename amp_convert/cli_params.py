"""The command line's parameter types and the helpers around click's
parameters: their config and field keys, the flag of a field (to spell a
library message's backquoted fields as flags), op lists and file paths."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import click


def parameters(command: click.Command) -> dict[str, click.Option]:
    """A command's options by key: the first long name, ``-`` as ``_``
    (``--tolerance`` -> tolerance). The keys are the config file's and the
    library options' field names."""
    found = {}
    for param in command.params:
        if isinstance(param, click.Option):
            longs = [o for o in param.opts if o.startswith("--")]
            found[longs[0][2:].replace("-", "_") if longs else param.name] = param
    return found


def flag_of(key: str, params: dict[str, click.Option]) -> str:
    """How the command line spells the option of field ``key`` (as declared first: -o for output)."""
    param = params.get(key)
    return key if param is None else param.opts[0]


def spelled_as_flags(message: str, command: click.Command | None) -> str:
    """A library message with each backquoted field (`` `data_max` ``) as its
    flag (--data-max); `` `validate` false `` as the flag's off switch."""
    params = parameters(command) if command is not None else {}

    def flag(match: re.Match) -> str:
        key, false = match.group(1), match.group(2)
        param = params.get(key)
        if false and param is not None and param.secondary_opts:
            return param.secondary_opts[0]
        return flag_of(key, params) + (false or "")

    return re.sub(r"`([a-z_0-9]+)`( false)?", flag, message)


def split_ops(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--white-list Add,Mul --white-list Sub`` -> ('Add', 'Mul', 'Sub')."""
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return tuple(out)


def only_list(values: tuple[str, ...]) -> tuple[str, ...] | None:
    """An --only-*-list given, even as ``""``, replaces the built-in list (an empty one, as
    the API's ``only_white_list=[]``); None when the option is absent."""
    return split_ops(values) if values else None


def file_path(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Path | None:
    """An output file name; one ending in a separator (or ``.``, ``..``) names a folder."""
    if value is None:
        return None
    if os.path.basename(value) in ("", ".", ".."):
        raise click.BadParameter(f"{value}: names a directory; give a file name")
    return Path(value)


class Finite(click.ParamType):
    """A finite float from ``least`` (excluded when ``above``) to ``most``: a bound or
    tolerance of NaN or infinity checks nothing, and click's FloatRange lets NaN through
    (every comparison with it is false)."""

    def __init__(self, name: str, least: float, most: float = math.inf, above: bool = False):
        self.name, self.least, self.most, self.above = name, least, most, above

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.least if self.above else number >= self.least
        if not (math.isfinite(number) and low_ok and number <= self.most):
            span = f"> {self.least:g}" if self.above else f">= {self.least:g}"
            span = span if math.isinf(self.most) else f"in [{self.least:g}, {self.most:g}]"
            self.fail(f"{value!r}: expected a finite number {span}", param, ctx)
        return number


TOLERANCE = Finite("tolerance", 0.0)


class Quantile(Finite):
    """A number in (0, 1] (a Finite, so a config file must give a number)."""

    def __init__(self) -> None:
        super().__init__("quantile", 0.0, 1.0, above=True)

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not 0.0 < number <= 1.0:  # (NaN fails too)
            self.fail(f"{value!r}: expected a number in (0, 1]", param, ctx)
        return number
