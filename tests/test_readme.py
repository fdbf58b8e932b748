"""The README's Python examples run, in order, as a newcomer would run them
from the repository root after the set-up command; the README stays short
and its links to docs/ resolve."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 200

FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks() -> list[str]:
    return FENCE.findall(_text())


def test_readme_is_short() -> None:
    lines = _text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines, at most {MAX_LINES}: move the detail to docs/"


def test_readme_has_python_examples() -> None:
    assert len(_blocks()) >= 3


def test_readme_links_resolve() -> None:
    targets = [t for t in LINK.findall(_text()) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_docs_links_resolve() -> None:
    missing = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, f"docs/ links to missing files: {missing}"


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block, in order, each in a fresh namespace, in a
    working directory laid out as the repository after the set-up command
    (models/ as in the repository, an empty out/)."""
    (tmp_path / "models").symlink_to(ROOT / "models", target_is_directory=True)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    blocks = _blocks()
    assert blocks
    for i, code in enumerate(blocks, 1):
        name = f"README.md python block {i}"
        try:
            exec(compile(code, name, "exec"), {"__name__": f"readme_block_{i}"})
        except Exception as e:  # (the block's own failure, named, with its code)
            pytest.fail(f"{name} raised {type(e).__name__}: {e}\n---\n{code}", pytrace=True)
    assert os.path.exists("out/resnet50.fp16.onnx")
