"""Sample files: .npz archives, folders of them and Polygraphy input JSON,
read one sample at a time; every failure is one line naming the file."""

from __future__ import annotations

import base64
import io
import json
import math
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np

from .errors import AmpError

NPY_MAGIC = b"\x93NUMPY"


def expand_files(inputs: Sequence[str | Path], option: str) -> list[Path]:
    """The sample files ``inputs`` names: files, and the .npz files of folders.
    ``option``: the field they came from, named in messages. Raises AmpError
    on a path that is missing, a folder of no .npz, or a file of another kind."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise AmpError(f"`{option}` {p}: the folder holds no .npz files")
            files.extend(found)
        elif p.is_file():
            if p.suffix not in (".npz", ".json"):
                raise AmpError(f"`{option}` {p}: expected a .npz file, a folder of them, or a Polygraphy .json")
            files.append(p)
        else:
            raise AmpError(f"`{option}` {p}: no such file or folder")
    return files


def read_samples(path: Path, origin: str) -> Iterator[dict[str, np.ndarray]]:
    if path.suffix == ".npz":
        yield _read_npz(path, origin)
    else:
        yield from _read_polygraphy_json(path, origin)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _read_npz(path: Path, origin: str) -> dict[str, np.ndarray]:
    """The arrays of an ``np.savez`` archive; every member must be an .npy array."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            hint = " (it is a single .npy array)" if f.read(len(NPY_MAGIC)) == NPY_MAGIC else ""
        raise AmpError(
            f"{origin}: is not an .npz (zip) archive{hint}; save inputs with np.savez(path, NAME=array, ...)"
        ) from None
    except OSError as e:
        raise AmpError(f"{origin}: cannot be read ({e.strerror or _first_line(e)})") from None
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for info in archive.infolist():
            where = f"{origin}: member {info.filename!r}"
            if not info.filename.endswith(".npy"):
                raise AmpError(f"{where} is not an .npy array; save inputs with np.savez(path, NAME=array, ...)")
            try:
                with archive.open(info) as member:
                    arrays[info.filename.removesuffix(".npy")] = _read_npy(member, info.file_size, where, "an .npy array")
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as e:
                # (corrupt or truncated data, an unsupported compression, an encrypted member)
                raise AmpError(f"{where} cannot be read ({_first_line(e)}); the archive is corrupt") from None
    return arrays


def _read_npy(fp: IO[bytes], size: int, where: str, kind: str) -> np.ndarray:
    """One .npy array of ``size`` bytes from ``fp``; the shape its header
    declares is checked against the bytes present before anything is allocated."""
    try:
        version = np.lib.format.read_magic(fp)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(fp)
    except ValueError as e:
        raise AmpError(f"{where} is not {kind} ({_first_line(e)})") from None
    if dtype.hasobject:
        raise AmpError(f"{where} holds object arrays (pickled Python objects), refused; save plain numeric arrays")
    declared, present = math.prod(shape) * dtype.itemsize, size - fp.tell()
    if declared > present:
        raise AmpError(
            f"{where} declares shape {list(shape)} of {dtype} ({declared:,} bytes) but holds {present:,} bytes; "
            "it is corrupt or truncated"
        )
    fp.seek(0)
    try:
        return np.lib.format.read_array(fp, allow_pickle=False)
    except ValueError as e:
        raise AmpError(f"{where} is not {kind} ({_first_line(e)})") from None
    except MemoryError:  # (a zip member's listed size can be false too)
        raise AmpError(f"{where} ({declared:,} bytes) does not fit in memory") from None


def _read_polygraphy_json(path: Path, origin: str) -> Iterator[dict[str, np.ndarray]]:
    """Polygraphy's ``--save-inputs`` format: a JSON list of {name: encoded ndarray}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AmpError(f"{origin}: not valid JSON ({e})") from None
    except RecursionError:
        raise AmpError(f"{origin}: JSON nested too deeply to be Polygraphy input data") from None
    except OSError as e:
        raise AmpError(f"{origin}: cannot be read ({e.strerror or _first_line(e)})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise AmpError(f"{origin}: expected a list of {{input name: array}} (Polygraphy input JSON)")
    for sample in data:
        yield {name: _decode_array(origin, name, enc) for name, enc in sample.items()}


def _decode_array(origin: str, name: str, encoded: object) -> np.ndarray:
    where = f"{origin}: input {name!r}"
    if not (isinstance(encoded, dict) and "array" in encoded):
        raise AmpError(f"{where} is not a Polygraphy-encoded array")
    try:
        raw = base64.b64decode(str(encoded["array"]).encode(), validate=True)
    except ValueError:  # (binascii.Error)
        raise AmpError(f"{where} is not a Polygraphy-encoded array (not base64)") from None
    return _read_npy(io.BytesIO(raw), len(raw), where, "a Polygraphy-encoded array")
