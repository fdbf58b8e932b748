"""``--config``: a TOML file's values become the command's defaults, so
flags given on the command line override them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .cli_params import Finite, parameters

NOT_CONFIG = ("config", "debug")  # options a config file cannot set


def load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager --config: the file's values become the defaults, so flags given
    on the command line override them."""
    if not value:
        return value
    from .config import read_config
    from .errors import AmpError
    from .load import remember_inputs

    try:
        data = read_config(value)
    except AmpError as e:
        raise click.BadParameter(str(e), param_hint="--config") from None
    remember_inputs([Path(value)])  # (no output may replace it)
    by_key = {k: p for k, p in parameters(ctx.command).items() if k not in NOT_CONFIG}
    params = {p.name: p for p in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, v in data.items():
        norm = key.replace("-", "_")
        if norm not in by_key:
            raise click.BadParameter(f"{value}: unknown option {key!r}", param_hint="--config")
        name = by_key[norm].name
        if by_key[norm].multiple:
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise click.BadParameter(f"{value}: {key} must be a string or a list of strings", param_hint="--config")
            if not v and norm in ("only_white_list", "only_black_list"):
                v = [""]  # (given empty, as the API's only_white_list=[]: click would read [] as absent)
        elif name in params:
            _check_config_number(value, key, v, params[name].type)
            _check_config_kind(value, key, v, params[name])
            try:
                params[name].type_cast_value(ctx, v)
            except (click.BadParameter, TypeError, ValueError, AttributeError) as e:
                message = e.format_message() if isinstance(e, click.ClickException) else str(e)
                raise click.BadParameter(f"{value}: {key}: {message}", param_hint="--config") from None
        defaults[name] = v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _check_config_kind(config: str, key: str, v: object, param: click.Parameter) -> None:
    """TOML values of the kind a flag or a path option takes: click would
    turn ``explain = 1`` into a string, and ``report = 5`` reach the file
    system as a number."""
    if getattr(param, "is_flag", False) and not isinstance(v, bool):
        raise click.BadParameter(f"{config}: {key} must be true or false, got {v!r}", param_hint="--config")
    if isinstance(param.type, (click.Path, click.types.StringParamType)) and not isinstance(v, str):
        raise click.BadParameter(f"{config}: {key} must be a string, got {v!r}", param_hint="--config")


def _check_config_number(config: str, key: str, v: object, kind: click.ParamType) -> None:
    """TOML numbers for numeric options: click would turn ``samples = 1.5``
    into 1 and ``atol = true`` into 1.0."""
    if isinstance(kind, click.types.IntParamType):
        wanted, types = "an integer", (int,)
    elif isinstance(kind, Finite):
        wanted, types = "a number", (int, float)
    else:
        return
    if not isinstance(v, types) or isinstance(v, bool):
        raise click.BadParameter(f"{config}: {key} must be {wanted}, got {v!r}", param_hint="--config")
