"""Saving: the output appears whole or not at all.

Everything is written to a temporary file in the target folder and renamed
over the target, so an interrupted write leaves the previous file (or none).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from .errors import AmpError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target``
    only if the block completes."""
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise AmpError(f"{target}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise AmpError(f"{target}: folder {folder} is not writable")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a report or plan atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
