"""Peak memory and time of a validated conversion of a model whose weights
are large against its activations (an LLM: scripts/build_llm.py builds one).

Each configuration runs as a process of its own; what is reported is its
wall time and its peak resident set: the process's own (``ru_maxrss`` from
``wait4``, the most any one process of its tree held) and the sum over its
tree, sampled every 50 ms from /proc (validation loads the converted model
in a child process too). Configurations:

- ``load-save``: ``onnx.load`` + ``onnx.save`` with external data (the floor);
- ``no-validate``: ``amp-convert MODEL --level O2 --no-validate``;
- ``O2``: the default validated command at each ``--tokens`` length
  (``--input-shape`` for every input with a sequence axis);
- ``auto``: ``--level auto`` at each length (only with ``--auto``);
- ``ort-fp32`` / ``ort-O2``: one plain onnxruntime session of the fp32
  model and of the converted one, and one run at each length (what
  validation costs is set against these two).

    python scripts/bench_memory.py models/cache/llm/llama-4x2048/model.onnx --tokens 128,512
    python scripts/bench_memory.py MODEL --code /work/main   # main's code ("before")

``--need-gib`` skips a configuration when the machine has less memory
available than that (a run that would be killed measures nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_LOAD_SAVE = """
import sys, onnx
m = onnx.load(sys.argv[1])
onnx.save(m, sys.argv[2], save_as_external_data=True, location="out.onnx.data")
"""

_ORT_RUN = """
import sys, time, numpy as np, onnxruntime as ort
path, tokens = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
built = time.perf_counter() - start
feeds = {}
for i in s.get_inputs():
    if "int" in i.type:
        feeds[i.name] = (np.ones if "mask" in i.name else np.zeros)((1, tokens), np.int64)
    else:
        feeds[i.name] = np.zeros((1, tokens), np.float32)
start = time.perf_counter()
s.run(None, feeds)
print(f"session {built:.1f} s, run {time.perf_counter() - start:.1f} s")
"""


@dataclass
class Measured:
    config: str
    tokens: int | None
    seconds: float
    peak_rss_gb: float  # the largest single process of the tree (ru_maxrss)
    peak_tree_gb: float  # the tree's summed RSS, sampled
    exit_code: int
    note: str = ""


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def _tree_rss(pid: int) -> int:
    """Summed RSS (bytes) of ``pid`` and its descendants (0 once gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) << 10
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def measure(config: str, tokens: int | None, argv: list[str], env: dict[str, str]) -> Measured:
    """Run ``argv`` as a child and measure it (see the module's docstring)."""
    start = time.perf_counter()
    # (run from the code's folder: ``-m amp_convert`` finds the package in the working folder first)
    child = subprocess.Popen(argv, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(child.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    note = lines[-1][:160] if lines else ""
    return Measured(config, tokens, seconds, usage.ru_maxrss / (1 << 20), peak[0] / (1 << 30), child.returncode, note)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--tokens", default="128,512", help="sequence lengths, comma-separated")
    p.add_argument("--configs", default="load-save,no-validate,O2,ort", help="load-save,no-validate,O2,auto,ort")
    p.add_argument("--code", type=Path, default=ROOT, help="the amp_convert checkout to run (PYTHONPATH)")
    p.add_argument("--extra", default="", help="more amp-convert options for the validated runs, space-separated")
    p.add_argument("--need-gib", type=float, default=0.0, help="skip a run when less memory than this is available")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    model = a.model.resolve()
    tokens = [int(t) for t in a.tokens.split(",") if t]
    configs = set(a.configs.split(","))
    env = {**os.environ, "PYTHONPATH": str(a.code.resolve())}
    py = sys.executable
    weights = sum(f.stat().st_size for f in model.parent.iterdir() if f.name.startswith(model.name))
    print(f"model {model} ({weights / 1e9:.2f} GB on disk), code {a.code}", flush=True)
    results: list[Measured] = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        converted = out / "nv.onnx"
        runs: list[tuple[str, int | None, list[str]]] = []
        if "load-save" in configs:
            runs.append(("load-save", None, [py, "-c", _LOAD_SAVE, str(model), str(out / "ls.onnx")]))
        if "no-validate" in configs or "ort" in configs:
            cmd = [py, "-m", "amp_convert", "convert", str(model), "--level", "O2", "--no-validate", "-o", str(converted)]
            runs.append(("no-validate", None, cmd))
        inputs = _sequence_inputs(model)
        for n in tokens:
            shapes = [x for name in inputs for x in ("--input-shape", f"{name}=1x{n}")]
            for level in ("O2", "auto"):
                if level in configs:
                    cmd = [py, "-m", "amp_convert", "convert", str(model), "--level", level, "-o", str(out / f"{level}.onnx")]
                    runs.append((level if not a.extra else f"{level} {a.extra}", n, [*cmd, *shapes, *a.extra.split()]))
            if "ort" in configs:
                runs.append(("ort-fp32", n, [py, "-c", _ORT_RUN, str(model), str(n)]))
                runs.append(("ort-O2", n, [py, "-c", _ORT_RUN, str(converted), str(n)]))
        for config, n, cmd in runs:
            free = _available_gib()
            if free < a.need_gib:
                m = Measured(config, n, 0.0, 0.0, 0.0, -1, f"skipped: {free:.1f} GiB available")
            else:
                m = measure(config, n, cmd, env)
            results.append(m)
            ratio = m.peak_tree_gb * (1 << 30) / weights if weights else 0.0
            print(
                f"{m.config:24} {m.tokens or '':>5} {m.seconds:7.1f} s  peak {m.peak_rss_gb:6.2f} GiB "
                f"(tree {m.peak_tree_gb:6.2f} GiB, {ratio:4.2f}x weights)  exit {m.exit_code}  {m.note}",
                flush=True,
            )
            for f in out.glob("O2.onnx*"):
                f.unlink()
    if a.json:
        a.json.write_text(
            json.dumps({"model": str(model), "weights_bytes": weights, "runs": list(map(asdict, results))}, indent=1)
        )
    return 0


def _sequence_inputs(model: Path) -> list[str]:
    """The graph inputs with a dynamic second axis (batch x sequence)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    names = []
    for v in m.graph.input:
        dims = v.type.tensor_type.shape.dim
        if v.name not in inits and len(dims) == 2 and not dims[1].HasField("dim_value"):
            names.append(v.name)
    return names


if __name__ == "__main__":
    sys.exit(main())
