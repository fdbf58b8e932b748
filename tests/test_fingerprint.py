"""The conversion fingerprint (scripts/fingerprint.py: one hash per model,
level and dtype of what amp-convert writes, over the zoo, the rule graphs
and a fixed fuzz corpus) is the committed baseline's, line for line.

A change that means to change what is written regenerates the baseline,
and its commit says which lines changed and why:

    PYTHONPATH=. python scripts/fingerprint.py > tests/data/fingerprint.txt
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "data" / "fingerprint.txt"
REGENERATE = "PYTHONPATH=. python scripts/fingerprint.py > tests/data/fingerprint.txt"


def test_the_fingerprint_is_the_baseline():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fingerprint.py")], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got, want = proc.stdout.splitlines(), BASELINE.read_text(encoding="utf-8").splitlines()
    changed = [f"- {w}\n+ {g}" for w, g in zip(want, got, strict=False) if w != g]
    assert len(got) == len(want), f"{len(got)} lines, the baseline has {len(want)} (intended? {REGENERATE})"
    assert not changed, f"{len(changed)} line(s) differ from {BASELINE.name} (intended? {REGENERATE}):\n" + "\n".join(
        changed[:20]
    )
