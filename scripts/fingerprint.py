"""The conversion fingerprint: one hash per (model, level, dtype) over what amp-convert writes.

A refactoring that must leave behaviour unchanged leaves every line of this
file's output unchanged. The corpus: the zoo (models/zoo, models/zoo/ort),
the rule graphs (models/rule_graphs.py) and a derandomized fuzz corpus
(tests/fuzz_graphs.py); levels O0-O3 in fp16 and bf16, converted through the
library (no calibration) and, for the zoo, through the command with
``--no-validate`` (the bytes it writes).

    python scripts/fingerprint.py > /tmp/before.txt
    ... change the code ...
    python scripts/fingerprint.py | diff /tmp/before.txt -
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from amp_convert import convert  # noqa: E402
from amp_convert.cli import main  # noqa: E402
from amp_convert.errors import AmpError, ConversionError  # noqa: E402

LEVELS = ("O0", "O1", "O2", "O3")
DTYPES = ("fp16", "bf16")
FUZZ_CASES = 40


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def zoo_paths() -> list[Path]:
    return sorted((ROOT / "models" / "zoo").glob("*.onnx")) + sorted((ROOT / "models" / "zoo" / "ort").glob("*.onnx"))


def rule_models() -> Iterator[tuple[str, onnx.ModelProto]]:
    from models.rule_graphs import RULE_GRAPHS

    for name, build in RULE_GRAPHS.items():
        yield f"rule/{name}", build()


def fuzz_models(count: int = FUZZ_CASES) -> list[tuple[str, onnx.ModelProto]]:
    """``count`` fuzz graphs, the same ones on every run (a fixed seed, no example database)."""
    from fuzz_graphs import fuzz_cases
    from hypothesis import HealthCheck, given, seed, settings

    found: list[onnx.ModelProto] = []

    @settings(max_examples=count, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @seed(20261202)
    @given(fuzz_cases())
    def collect(case) -> None:
        found.append(case.model)

    collect()
    return [(f"fuzz/{i:03d}", m) for i, m in enumerate(found)]


def library_line(name: str, model: onnx.ModelProto, level: str, dtype: str) -> str:
    try:
        result = convert(model, level=level, dtype=dtype)
    except (AmpError, ConversionError) as e:
        return f"{name} {level} {dtype} error {_digest(str(e).encode())}"
    model_hash = _digest(result.model.SerializeToString(deterministic=True))
    return f"{name} {level} {dtype} {model_hash} plan {_digest(result.plan.to_json().encode())}"


def command_line(path: Path, level: str, dtype: str, folder: Path) -> str:
    out = folder / f"{path.stem}.{level}.{dtype}.onnx"
    code = main([str(path), "--level", level, "--dtype", dtype, "--no-validate", "--quiet", "-o", str(out)])
    written = _digest(out.read_bytes()) if out.exists() else "-"
    return f"cli/{path.relative_to(ROOT / 'models')} {level} {dtype} exit {code} {written}"


def main_() -> None:
    models = [(f"zoo/{p.relative_to(ROOT / 'models' / 'zoo')}", onnx.load(str(p))) for p in zoo_paths()]
    models += list(rule_models()) + fuzz_models()
    for name, model in models:
        for level in LEVELS:
            for dtype in DTYPES:
                print(library_line(name, model, level, dtype), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for path in zoo_paths():
            for level in LEVELS:
                for dtype in DTYPES:
                    print(command_line(path, level, dtype, Path(folder)), flush=True)


if __name__ == "__main__":
    main_()
