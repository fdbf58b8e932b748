"""Start-up time of the command against the interpreter and onnx's import.

    .venv/bin/python scripts/bench_startup.py [--runs 11]

Each row is the median wall time of ``--runs`` fresh processes (the first
run of each is discarded: it warms the file cache). Target: ``amp-convert
--help`` in at most 0.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import onnx

BIN = Path(sys.executable).parent
ROWS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import onnx'": [sys.executable, "-c", "import onnx"],
    "python -c 'import amp_convert'": [sys.executable, "-c", "import amp_convert"],
    "amp-convert --version": [str(BIN / "amp-convert"), "--version"],
    "amp-convert --help": [str(BIN / "amp-convert"), "--help"],
    "amp-convert lists": [str(BIN / "amp-convert"), "lists"],
}


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for k in range(runs + 1):
        began = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if k:
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, onnx {onnx.__version__}, ml_dtypes {ml_dtypes.__version__}, {args.runs} runs")
    print(f"{'command':34s} {'median s':>9s}")
    for label, argv in ROWS.items():
        seconds = median_seconds(argv, args.runs)
        verdict = "  (target <= 0.5 s: " + ("met)" if seconds <= 0.5 else "MISSED)") if label.endswith("--help") else ""
        print(f"{label:34s} {seconds:9.3f}{verdict}")


if __name__ == "__main__":
    main()
