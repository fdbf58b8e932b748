"""Output paths, vetted before anything is written: never the input model,
never two outputs in one file, each one a file that can be written."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import AmpError, UsageError

if TYPE_CHECKING:
    pass


def files_size(model: Path, data_files: Iterable[str]) -> int:
    """Bytes of a model file and of the external data files (named relative to its folder) it was read with."""
    return model.stat().st_size + sum((model.parent / f).stat().st_size for f in data_files if (model.parent / f).is_file())


def check_outputs(models: list[Path], targets: dict[str, Path | None], unchecked: Iterable[str] = ()) -> None:
    """Refuse, before anything is written, an output that is one of
    ``models`` or cannot be written as a file, or two outputs of one file.
    ``targets``: each output by its label in messages (a field in
    backquotes); ``unchecked``: labels whose path is only compared."""
    seen: dict[Path, str] = {}
    for label, target in targets.items():
        if target is None:
            continue
        if label not in unchecked:
            for model in models:
                _check_output_path(model, target, label)
        key = target.resolve()
        if key in seen:
            raise UsageError(f"{target}: given as both {seen[key]} and {label}; each output needs its own file", _named(label))
        seen[key] = label


def _named(label: str) -> str:
    """The field a label names (`` `output`'s data file `` -> output)."""
    return label.split("`")[1] if "`" in label else label


def _check_output_path(model: Path, output: Path, label: str) -> None:
    """Refuse the path given as ``label`` (named in the message) when it is the
    input model or cannot be written as a file."""
    from .saving import check_output_path

    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise UsageError(
            f"{label} {output}: output is the input file; choose another {label} (the input is never overwritten)",
            _named(label),
        )
    try:
        check_output_path(output)
    except AmpError as e:
        raise UsageError(f"{label} {e}", _named(label)) from None
