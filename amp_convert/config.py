"""Config files: the TOML file ``amp-convert --config`` reads, read into the
library's options so that the API runs what the command would.

A config file holds the convert command's long options (dashes or
underscores) at its top level, or all under an ``[amp-convert]`` table. Its
keys are the option dataclasses' fields (:class:`ConvertOptions`,
:class:`ValidationOptions`, :class:`AutoOptions`, :class:`OutputOptions`),
:func:`~amp_convert.workflow.convert_file`'s ``validate`` and ``check``, and
the command line's own :data:`DISPLAY_KEYS` (what it prints, which a run
from Python has no use for). ``level = "auto"`` asks for the auto search.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import AmpError, InputError, UsageError
from .options import AutoOptions, ConvertOptions, OutputOptions, ValidationOptions

# The command line's own keys: what it prints (--explain, --json, -q), not what a run does.
DISPLAY_KEYS = ("explain", "json", "quiet")
# convert_file's arguments beside the options, and their defaults.
RUN_KEYS = {"validate": True, "check": "full"}
TABLES = ("amp-convert", "amp_convert")
_OPTIONS = (ConvertOptions, ValidationOptions, AutoOptions, OutputOptions)
# Op lists a config file may give as one comma-separated string, as on the command line.
_OP_LISTS = ("white_list", "black_list", "only_white_list", "only_black_list")


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The options table of the TOML file at ``path``, keys as written.

    Raises InputError where the file is missing, a folder, unreadable or
    not TOML; UsageError where options sit both inside an ``[amp-convert]``
    table and outside it, or the table is no table. Each message starts
    with ``path``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    name = os.fspath(path)
    try:
        if Path(path).is_dir():
            raise InputError(f"{name}: is a directory, not a TOML file")
        if not Path(path).is_file():
            raise InputError(f"{name}: no such file")
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{name}: cannot be read ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{name}: malformed TOML ({e})") from None
    except RecursionError:
        raise InputError(f"{name}: malformed TOML (nested too deeply)") from None
    table = next((k for k in TABLES if k in data), None)
    if table is not None:
        outside = sorted(k for k in data if k != table)
        if outside:
            raise UsageError(
                f"{name}: {outside[0]!r} is outside the [{table}] table; put every option in it "
                "(or all at the top level, without the table)"
            )
        data = data[table]
    if not isinstance(data, dict):
        raise UsageError(f"{name}: [amp-convert] must be a table of options")
    return data


def config_keys() -> frozenset[str]:
    """Every key a config file may hold (underscores): the options' fields
    that are options of the command, the run's keys and DISPLAY_KEYS."""
    internal = {"keep_fp32_nodes", "force_low_nodes"}  # (the auto search sets them: no option)
    found = {f.name for cls in _OPTIONS for f in fields(cls) if not f.name.startswith("_") and f.name not in internal}
    return frozenset(found | set(RUN_KEYS) | set(DISPLAY_KEYS))


@dataclass(frozen=True)
class ConfigFile:
    """A config file read into the library's options: the arguments of
    :func:`~amp_convert.workflow.convert_file` (see :meth:`arguments`).

    ``auto``: the search's options where the file says ``level = "auto"``
    (``convert.level`` is then None), else None; ``display``: the command
    line's own keys the file set (DISPLAY_KEYS); ``given``: every key it
    set, with underscores."""

    path: Path
    convert: ConvertOptions = field(default_factory=ConvertOptions)
    validation: ValidationOptions = field(default_factory=ValidationOptions)
    auto: AutoOptions | None = None
    outputs: OutputOptions = field(default_factory=OutputOptions)
    validate: bool = True
    check: str = "full"
    display: dict[str, bool] = field(default_factory=dict)
    given: frozenset[str] = frozenset()

    def arguments(self) -> dict[str, Any]:
        """``convert_file``'s keyword arguments: ``convert_file(model, **config.arguments())``."""
        return {
            "options": self.convert,
            "validation": self.validation,
            "validate": self.validate,
            "auto": self.auto,
            "outputs": self.outputs,
            "check": self.check,
        }


def load_config(path: str | os.PathLike) -> ConfigFile:
    """Read the config file at ``path`` (the format ``amp-convert --config``
    reads) into the library's options, each validated.

    Returns a :class:`ConfigFile`; ``convert_file(model,
    **config.arguments())`` runs what the command would. Raises InputError where the file cannot be read as TOML, and UsageError
    on an unknown key, a value of the wrong kind (``samples = 1.5``, ``safety
    = 1``) or a bad value (the options' own checks); each message starts with
    ``path`` and names the key's field in backquotes."""
    name = os.fspath(path)
    values: dict[str, Any] = {}
    keys = config_keys()
    for key, value in read_config(path).items():
        norm = key.replace("-", "_")
        if norm not in keys:
            raise UsageError(f"{name}: unknown option {key!r}")
        values[norm] = _checked(name, norm, value)
    auto = values.get("level") == "auto"
    if auto:
        values["level"] = None
    parts = {cls: {f.name: values[f.name] for f in fields(cls) if f.name in values} for cls in _OPTIONS}
    try:
        convert = ConvertOptions(**parts[ConvertOptions]).validated()
        validation = ValidationOptions(**parts[ValidationOptions]).validated()
        search = AutoOptions(**parts[AutoOptions]).validated()
        outputs = OutputOptions(**parts[OutputOptions]).validated()
        if values.get("check", "full") not in ("full", "basic", "none"):
            raise UsageError(f"unknown `check` {values['check']!r}: use one of full, basic, none", "check")
    except AmpError as e:
        raise type(e)(f"{name}: {e}", e.field) from None
    return ConfigFile(
        Path(path),
        convert,
        validation,
        search if auto else None,
        outputs,
        values.get("validate", RUN_KEYS["validate"]),
        values.get("check", RUN_KEYS["check"]),
        {k: values[k] for k in DISPLAY_KEYS if k in values},
        frozenset(values),
    )


def _checked(config: str, key: str, value: object) -> Any:
    """``value`` as field ``key`` takes it: TOML gives strings, numbers,
    booleans and lists, and each field takes one kind (a list field also
    one string; an op list also one comma-separated string). Raises
    UsageError naming the key where the kind is wrong."""
    kind = _kind(key)
    wrong = f"{config}: `{key}` must be {{}}, got {value!r}"
    if kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise UsageError(wrong.format("a string or a list of strings"), key)
        if key in _OP_LISTS:
            return tuple(op.strip() for v in items for op in v.split(",") if op.strip())
        return tuple(items)
    if kind == "bool" and not isinstance(value, bool):
        raise UsageError(wrong.format("true or false"), key)
    if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        raise UsageError(wrong.format("an integer"), key)
    if kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise UsageError(wrong.format("a number"), key)
    if kind == "str" and not isinstance(value, str):
        raise UsageError(wrong.format("a string"), key)
    if kind == "mapping" and not isinstance(value, (list, dict)):
        raise UsageError(wrong.format("a list of NAME:FIELD=VALUE,... strings"), key)
    return value


def _kind(key: str) -> str:
    """The kind of value field ``key`` takes, from its type hint: list, bool, int, float, str or mapping."""
    if key in RUN_KEYS:
        return type(RUN_KEYS[key]).__name__
    if key in DISPLAY_KEYS:
        return "bool"
    cls = next(c for c in _OPTIONS if key in {f.name for f in fields(c)})
    hint = str(typing.get_type_hints(cls)[key])
    if "Mapping" in hint:
        return "mapping"
    if "tuple" in hint:
        return "list"
    for kind in ("bool", "float", "int"):
        if kind in hint:
            return kind
    return "str"  # (str, str | None, Path | None)
