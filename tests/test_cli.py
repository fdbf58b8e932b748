"""The command line, run as a real process and in-process through main()."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import shape_readers_model
from onnx import helper, numpy_helper

from amp_convert import AmpError, convert
from amp_convert.cli import main

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"


@pytest.fixture
def resnet(tmp_path) -> Path:
    path = tmp_path / "resnet50.onnx"
    path.write_bytes((ZOO / "resnet50.onnx").read_bytes())
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("amp-convert")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)


def test_console_script_converts_with_default_output_name(resnet):
    before = resnet.read_bytes()
    proc = cli(str(resnet), "--level", "O2")
    assert proc.returncode == 0, proc.stderr
    out = resnet.with_name("resnet50.fp16.onnx")
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    assert "O2 fp16" in proc.stdout
    assert resnet.read_bytes() == before
    assert out.stat().st_size < 0.6 * len(before)  # weights stored in fp16


def test_python_dash_m_runs_the_command_with_its_exit_codes(resnet, tmp_path):
    """``python -m amp_convert`` is the command: its output arrives whole and
    its exit code is main's."""
    run = [sys.executable, "-m", "amp_convert"]
    ok = subprocess.run([*run, str(resnet), "-o", str(tmp_path / "out.onnx"), "--check", "none"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # (the summary line is written last: all of it, with its newline)
    assert "out.onnx: O2 fp16" in ok.stdout.splitlines()[-1] and ok.stdout.endswith(" s\n")
    bad = subprocess.run([*run, str(tmp_path / "missing.onnx")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def _python(script: str) -> list[str]:
    """The words ``script`` prints, run in a fresh interpreter (what it imports is its own); it must succeed."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_converting_without_validation_loads_nothing_of_validation(resnet, tmp_path):
    """A conversion without validation (CI steps, large graphs) does not
    start by importing onnxruntime or the validation modules: only the
    options that need them load them."""
    script = (
        "import sys\n"
        "from amp_convert.cli import main\n"
        f"code = main([{str(resnet)!r}, '-o', {str(tmp_path / 'out.onnx')!r}, '--no-validate', '-q'])\n"
        "heavy = ('onnxruntime', 'amp_convert.validation', 'amp_convert.calibrate', 'amp_convert.inputs', 'amp_convert.auto')\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    assert _python(script) == ["0", "[]"]
    assert (tmp_path / "out.onnx").is_file()


def test_the_command_under_a_profiler_ends_as_usual(tmp_path):
    """A profiler (or tracer) watching the command saves its data at exit."""
    exe, profile = Path(sys.executable).with_name("amp-convert"), tmp_path / "run.prof"
    run = [sys.executable, "-m", "cProfile", "-o", str(profile), str(exe), "lists"]
    proc = subprocess.run(run, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Softmax" in proc.stdout and profile.stat().st_size > 0


def test_default_output_name_follows_the_dtype(resnet):
    proc = cli(str(resnet), "--dtype", "bf16", "--no-validate", "-q")
    assert proc.returncode == 0, proc.stderr
    converted = onnx.load(str(resnet.with_name("resnet50.bf16.onnx")))
    assert onnx.TensorProto.BFLOAT16 in {t.data_type for t in converted.graph.initializer}
    assert not resnet.with_name("resnet50.fp16.onnx").exists()


def _planned(resnet: Path, tmp_path: Path, *flags: str) -> dict[str, dict]:
    """Run the CLI in-process with ``flags``; the plan's entries by node name."""
    plan_path = tmp_path / "plan.json"
    assert main([str(resnet), "-o", str(tmp_path / "o.onnx"), "--no-validate", "-q", "--plan-json", str(plan_path), *flags]) == 0
    plan = json.loads(plan_path.read_text())
    return {"": plan} | {n["name"]: n for n in plan["nodes"]}


def _precisions(plan: dict, op: str) -> set[str]:
    return {n["precision"] for name, n in plan.items() if name and n["op_type"] == op}


def _integer_model(float_path: bool) -> onnx.ModelProto:
    """int64 x -> Add, Mul -> y at opset 11 (IR 6); ``float_path``: the sum goes through float32 and back."""
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add")]
    if float_path:
        nodes += [
            helper.make_node("Cast", ["s"], ["f"], name="to_float", to=onnx.TensorProto.FLOAT),
            helper.make_node("Relu", ["f"], ["r"], name="relu"),
            helper.make_node("Cast", ["r"], ["s2"], name="to_int", to=onnx.TensorProto.INT64),
        ]
    nodes.append(helper.make_node("Mul", ["s2" if float_path else "s", "b"], ["y"], name="mul"))
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, [2, 4]) for n in ("x", "y")]
    b = numpy_helper.from_array(np.arange(8, dtype=np.int64).reshape(2, 4), "b")
    m = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], [b]), opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 6
    return m


@pytest.mark.parametrize("validate", ["--validate", "--no-validate"])
@pytest.mark.parametrize("float_path", [False, True])
def test_bf16_upgrades_the_opset_only_where_there_is_float32_to_convert(tmp_path, validate, float_path):
    """bf16 Casts need opset 13: a model below it is upgraded, unless it has
    no float32 tensor at all (nothing is converted: it keeps its opset and
    IR version)."""
    source, out, plan = tmp_path / "int.onnx", tmp_path / "out.onnx", tmp_path / "plan.json"
    onnx.save(_integer_model(float_path), str(source))
    proc = cli(str(source), "--dtype", "bf16", "--level", "O3", validate, "-o", str(out), "--plan-json", str(plan))
    assert proc.returncode == 0, proc.stderr
    written = onnx.load(str(out))
    upgraded = any(n.startswith("opset upgraded from 11 to 13") for n in json.loads(plan.read_text())["notes"])
    assert (written.opset_import[0].version, written.ir_version, upgraded) == ((13, 7, True) if float_path else (11, 6, False))


def test_list_and_rule_flags_reach_the_plan(resnet, tmp_path):
    """Each list and node-name flag, given on the command line, decides the nodes it names."""
    plan = _planned(resnet, tmp_path, "--level", "O3", "--keep-batchnorm-fp32", "--no-fold-batchnorm")
    assert _precisions(plan, "BatchNormalization") == {"fp32"}
    plan = _planned(resnet, tmp_path, "--level", "O2", "--no-keep-batchnorm-fp32")
    assert _precisions(plan, "BatchNormalization") == {"low"}
    plan = _planned(resnet, tmp_path, "--level", "O2", "--no-fold-batchnorm")
    assert _precisions(plan, "BatchNormalization") == {"fp32"}  # keep_batchnorm_fp32 is O2's default
    plan = _planned(resnet, tmp_path, "--level", "O2")
    assert _precisions(plan, "BatchNormalization") == set() and len(plan[""]["folded"]) == 16  # (kept fp32: folded)

    plan = _planned(resnet, tmp_path, "--level", "O1", "--lists", "paddle")
    assert plan[""]["profile"] == "paddle"

    plan = _planned(resnet, tmp_path, "--level", "O2", "--keep-fp32", "^/conv1/", "--keep-fp32", "/fc/")
    assert plan["/conv1/Conv"]["rule"] == plan["/fc/Gemm"]["rule"] == "user-keep-fp32"
    assert plan["/layer1/layer1.0/conv1/Conv"]["precision"] == "low"

    plan = _planned(resnet, tmp_path, "--level", "O1", "--force-low", "^/bn1/", "--force-low", "/avgpool/")
    assert plan["/bn1/BatchNormalization"]["rule"] == plan["/avgpool/GlobalAveragePool"]["rule"] == "user-force-low"
    assert plan["/bn1/BatchNormalization"]["precision"] == "low"

    plan = _planned(resnet, tmp_path, "--level", "O1", "--white-list", "Add", "--black-list", "Gemm")
    assert _precisions(plan, "Add") == {"low"} and plan["/fc/Gemm"]["rule"] == "black-list"

    plan = _planned(resnet, tmp_path, "--only-white-list", "Gemm")
    assert plan[""]["level"] == "O1" and _precisions(plan, "Conv") == {"fp32"} and plan["/fc/Gemm"]["precision"] == "low"

    plan = _planned(resnet, tmp_path, "--only-black-list", "Conv")
    assert plan[""]["level"] == "O2" and _precisions(plan, "Conv") == {"fp32"} and plan["/fc/Gemm"]["precision"] == "low"
    assert _precisions(plan, "BatchNormalization") == {"low"}  # the list replaced: BatchNormalization is no longer on it
    plan = _planned(resnet, tmp_path, "--only-black-list", "Conv", "--keep-batchnorm-fp32", "--no-fold-batchnorm")
    assert _precisions(plan, "BatchNormalization") == {"fp32"} and _precisions(plan, "Conv") == {"fp32"}  # unless asked


def test_an_empty_only_list_replaces_the_list_as_the_api_does(resnet, tmp_path):
    """``--only-white-list ""`` is given, not absent: O1 with nothing white,
    as ``convert(only_white_list=[])``; an empty only-black-list is O2 with none black."""
    api = convert(str(resnet), only_white_list=[]).plan
    for empty in ("", ","):
        plan = _planned(resnet, tmp_path, "--only-white-list", empty)
        assert plan[""]["level"] == api.level == "O1"
        assert [n["precision"] for n in plan[""]["nodes"]] == [e.as_dict()["precision"] for e in api]
        assert "low" not in _precisions(plan, "Conv")
    plan = _planned(resnet, tmp_path, "--only-black-list", "")
    assert plan[""]["level"] == "O2" and _precisions(plan, "BatchNormalization") == {"low"}
    config = tmp_path / "amp.toml"
    config.write_text("only-white-list = []\n")
    plan = _planned(resnet, tmp_path, "--config", str(config))
    assert plan[""]["level"] == "O1" and "low" not in _precisions(plan, "Conv")


def test_explain_and_plan_json(resnet, tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    rc = main([str(resnet), "--level", "O1", "-o", str(tmp_path / "o.onnx"), "--explain", "--plan-json", str(plan_path)])
    assert rc == 0
    shown = capsys.readouterr().out
    assert "/conv1/Conv" in shown and "white list" in shown
    plan = json.loads(plan_path.read_text())
    # every node of the model: planned, or folded into the Conv before it
    assert plan["level"] == "O1" and len(plan["nodes"]) + len(plan["folded"]) == len(onnx.load(str(resnet)).graph.node)
    assert {"node": "/bn1/BatchNormalization", "into": "/conv1/Conv"} in plan["folded"]
    assert re.search(r"/bn1/BatchNormalization +BatchNormalization +folded +folded into /conv1/Conv", shown)
    conv = next(n for n in plan["nodes"] if n["name"] == "/conv1/Conv")
    assert conv["precision"] == "low" and conv["rule"] == "white-list"


def test_shape_readers_count_as_unchanged_in_the_summary_line_and_the_json(tmp_path, capsys):
    """The summary line, the plan JSON and the report's JSON give one set of
    totals, in which Shape and Size (reading a low tensor for its shape
    alone) are unchanged nodes, not fp32 ones."""
    path = tmp_path / "shapes.onnx"
    onnx.save(shape_readers_model(), str(path))
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "report.json"
    flags = ["--level", "O2", "--no-validate", "--plan-json", str(plan_path), "--report", str(report_path)]
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), *flags]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert "O2 fp16, 3 low / 0 fp32 / 2 unchanged nodes" in summary
    counts = {"low": 3, "fp32": 0, "unchanged": 2}
    assert json.loads(plan_path.read_text())["counts"] == json.loads(report_path.read_text())["plan"]["counts"] == counts


def test_lists_command(capsys):
    assert main(["lists", "--profile", "mindspore", "--level", "O1"]) == 0
    out = capsys.readouterr().out
    assert "BatchNormalization" in out.split("black")[1] and "Gemm" in out.split("black")[0]
    assert "unlisted ops: fp32 at O1" in out


def test_lists_at_o0_say_nothing_runs_low(capsys, resnet, tmp_path):
    """O0 converts nothing (the converted plan agrees): no list is shown as in force."""
    assert main(["lists", "--level", "O0"]) == 0
    out = capsys.readouterr().out
    assert "O0 changes nothing" in out and "white (" not in out and "low at O0" not in out
    plan_path = tmp_path / "plan.json"
    assert main([str(resnet), "--level", "O0", "-o", str(tmp_path / "a.onnx"), "--plan-json", str(plan_path), "-q"]) == 0
    assert {n["precision"] for n in json.loads(plan_path.read_text())["nodes"]} == {"fp32"}


@pytest.mark.parametrize("profile", ["default", "paddle"])
def test_lists_at_o3_say_every_op_runs_low(capsys, resnet, tmp_path, profile):
    """O3 runs every op low, listed to follow or not (the converted plan agrees): no follow list is shown."""
    assert main(["lists", "--profile", profile, "--level", "O3"]) == 0
    out = capsys.readouterr().out
    assert "O3 runs every op low" in out and "follow (" not in out and "follow their inputs" not in out
    plan = _planned(resnet, tmp_path, "--level", "O3", "--lists", profile)
    assert _precisions(plan, "MaxPool") == _precisions(plan, "Add") == {"low"}


@pytest.mark.parametrize("top", [7, 0])
def test_top_sets_the_offenders_the_terminal_lists(resnet, tmp_path, capsys, top):
    """--top N: N offending nodes in the terminal table, as in the reports (it showed 5 at most)."""
    report = tmp_path / "r.json"
    assert main([str(resnet), "-o", str(tmp_path / "o.onnx"), "--top", str(top), "--report", str(report)]) == 0
    shown = capsys.readouterr().out.split("worst first:\n")
    listed = shown[1].split("\n\n")[0].splitlines() if len(shown) > 1 else []
    assert len(listed) == len(json.loads(report.read_text())["validation"]["offenders"]) == top


def test_config_file_and_flags_override_it(resnet, tmp_path):
    config = tmp_path / "amp.toml"
    # (max-trials for the runs that are auto: from a config file it is no error at another level)
    config.write_text('level = "O3"\ndtype = "bf16"\nwhite-list = ["Add"]\nmax-trials = 4\n')
    plan_path = tmp_path / "plan.json"
    assert main([str(resnet), "--config", str(config), "-o", str(tmp_path / "a.onnx"), "--plan-json", str(plan_path), "-q"]) == 0
    assert json.loads(plan_path.read_text())["level"] == "O3"
    assert json.loads(plan_path.read_text())["dtype"] == "bf16"
    assert (
        main(
            [
                str(resnet),
                "--config",
                str(config),
                "--level",
                "O1",
                "-o",
                str(tmp_path / "b.onnx"),
                "--plan-json",
                str(plan_path),
                "-q",
            ]
        )
        == 0
    )
    assert json.loads(plan_path.read_text())["level"] == "O1"


@pytest.mark.parametrize(("command", "least"), [("convert", 15), ("compare", 5), ("lists", 3)])
def test_help_gives_an_example_for_each_option(command, least):
    proc = cli(command, "--help")
    assert proc.returncode == 0
    options = [line for line in proc.stdout.splitlines() if line.startswith("  -") and "--help" not in line]
    assert len(options) >= least
    assert proc.stdout.count("Example:") >= len(options)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such file"),
        (["{model}", "--level", "O9"], "--level"),
        (["{model}", "--dtype", "fp8"], "--dtype"),
        (["{model}", "--white-list", "Convv"], "unknown ONNX op type 'Convv'"),
        (["{model}", "--white-list", "Add", "--black-list", "Add"], "both"),
        (["{model}", "--only-white-list", "Gemm", "--black-list", "Gemm"], "in both --only-white-list and --black-list: Gemm"),
        (["{model}", "--only-black-list", "Relu", "--white-list", "Relu"], "in both --white-list and --only-black-list: Relu"),
        (["{model}", "--only-white-list", "Conv", "--only-black-list", "Relu"], "not both"),
        (
            ["{model}", "--only-black-list", "BatchNormalization", "--no-keep-batchnorm-fp32"],
            "BatchNormalization is on --only-black-list, and --no-keep-batchnorm-fp32 runs it low",
        ),
        (["{model}", "--keep-fp32", "("], "invalid regular expression"),
        (["{model}", "--max-trials", "5"], "--max-trials applies to --level auto only (the level is O2)"),
        (["{model}", "--level", "O1", "--auto-from", "O2"], "--auto-from applies to --level auto only (the level is O1)"),
        (["{model}", "--config", "{tmp}/auto.toml", "--level", "O1", "--max-trials", "3"], "--max-trials applies"),
        (["{model}", "-o", "{model}"], "output is the input"),
        (["{model}", "-o", "{tmp}/no/such/dir/out.onnx"], "does not exist"),
        (["{model}", "--config", "{tmp}/bad.toml"], "malformed TOML"),
        (["{model}", "--config", "{tmp}/unknown.toml"], "unknown option 'colour'"),
    ],
)
def test_usage_errors_exit_2_with_one_line_and_write_nothing(resnet, tmp_path, args, message):
    (tmp_path / "bad.toml").write_text("level = \n")
    (tmp_path / "unknown.toml").write_text('colour = "blue"\n')
    (tmp_path / "auto.toml").write_text('level = "auto"\nmax-trials = 4\n')
    before = resnet.read_bytes()
    files_before = sorted(p.name for p in tmp_path.iterdir())
    subst = {"model": str(resnet), "missing": str(tmp_path / "missing.onnx"), "tmp": str(tmp_path)}
    proc = cli(*[a.format(**subst) for a in args])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert resnet.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before


def test_debug_shows_a_traceback(tmp_path):
    proc = cli(str(tmp_path / "missing.onnx"), "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def _run_on_a_terminal(*args: str) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as its stdout and stderr; (exit code, what it wrote)."""
    import os
    import pty

    exe = Path(sys.executable).with_name("amp-convert")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def test_progress_shows_on_a_terminal_and_nowhere_else(resnet, tmp_path):
    rc, shown = _run_on_a_terminal(str(resnet), "-o", str(tmp_path / "a.onnx"))
    assert rc == 0 and "converting: " in shown and "validating" in shown
    rc, shown = _run_on_a_terminal(str(resnet), "-o", str(tmp_path / "b.onnx"), "-q")
    assert rc == 0 and shown.strip() == ""  # --quiet: nothing at all
    piped = cli(str(resnet), "-o", str(tmp_path / "c.onnx"))
    assert piped.returncode == 0 and "converting: " not in piped.stderr and "validating" not in piped.stderr


def test_no_arguments_print_the_help_as_it_reads(capsys):
    """Not folded into one 'error:' line: the usage, the examples, the commands, each on its own line."""
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: amp-convert") and "error:" not in err
    assert "\n  convert " in err and "amp-convert model.onnx --level O2 -o out.onnx\n" in err


def _reshape_model(path: Path, dims: tuple, target: list[int]) -> Path:
    """x (dims, maybe dynamic) -> MatMul -> Reshape to ``target``: runs only where x holds that many values."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    shape = numpy_helper.from_array(np.array(target, np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 4])],
        [w, shape],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_input_model_failing_on_generated_inputs_says_which_dims_and_what_to_give(tmp_path, capsys):
    """A dynamic dimension generated as 1 that the model cannot run with:
    the fp32 model's failure is named as the input's, with the dimension
    set and the options that fix it (exit 2, nothing written); given the
    shape, the same command converts."""
    path = _reshape_model(tmp_path / "m.onnx", ("n", 4), [2, 4, 4])
    out = tmp_path / "o.onnx"
    assert main([str(path), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the input model fails to run (on generated inputs: the dynamic dimensions of x were set to 1" in err
    assert "--input-shape" in err and "--input-range" in err and "Reshape" in err  # (silero-vad needs both)
    assert not out.exists()
    assert main([str(path), "-o", str(out), "-q", "--input-shape", "x=8x4"]) == 0
    assert out.exists()


def test_input_model_failing_on_given_samples_names_them(tmp_path, capsys):
    path = _reshape_model(tmp_path / "m.onnx", ("n", 4), [2, 4, 4])
    samples = tmp_path / "s.npz"
    np.savez(samples, x=np.ones((3, 4), np.float32))
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--inputs", str(samples)]) == 2
    err = capsys.readouterr().err
    assert "the input model fails to run (on the samples of --inputs)" in err and "--input-shape" not in err


def test_compare_names_the_candidate_that_fails_where_the_reference_runs(tmp_path, capsys):
    reference = _reshape_model(tmp_path / "ref.onnx", (8, 4), [2, 4, 4])
    candidate = _reshape_model(tmp_path / "cand.onnx", (8, 4), [3, 4, 4])
    assert main(["compare", str(reference), str(candidate), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{candidate} fails to run where {reference} runs" in err


def _low_function_model(path: Path, ir_version: int = 8, function_opset: int = 17, op: str = "MatMul") -> Path:
    """x -> Cast to fp16 -> a call of the model's local function
    local::Half (``op`` of its input and an fp16 Constant: MatMul by half
    the identity, or Mul by 0.5; at ``function_opset``, the model's is 17)
    named "call" -> Cast to fp32 -> y. onnxruntime runs it; its emulation
    twin inlines the call. MatMul and Constant have one schema from opset
    13 to 18; Mul has a new one from 14, so a Mul body at 13 means
    something else at the model's opset (onnx's checker refuses that
    model; onnxruntime reads the body at 17)."""
    from onnx import TensorProto, helper, numpy_helper

    half = np.array(0.5, np.float16) if op == "Mul" else np.eye(4, dtype=np.float16) / 2
    body = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(half, "half")),
        helper.make_node(op, ["a", "k"], ["o"]),
    ]
    opset = [helper.make_opsetid("", function_opset)]
    function = helper.make_function("local", "Half", ["a"], ["o"], body, opset_imports=opset)
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], name="to16", to=TensorProto.FLOAT16),
        helper.make_node("Half", ["x16"], ["h16"], name="call", domain="local"),
        helper.make_node("Cast", ["h16"], ["y"], name="to32", to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    m = helper.make_model(graph, opset_imports=opsets, functions=[function])
    m.ir_version = ir_version
    onnx.save(m, str(path))
    return path


def test_a_model_whose_local_function_computes_in_fp16_validates_through_its_twin(tmp_path, capsys):
    """A model holding fp16, in a local function's body too, runs through
    its emulation twin on the CPU (the input of a conversion, either file
    of compare). The twin inlines the call, so the body computes float32
    rounded to fp16 like the rest; it left the body as written, whose fp16
    Constant met the twin's float32 input: onnxruntime refused the twin
    (exit 3). The per-node diff lists the nodes it did without the twin
    (--emulate never): the inlined body's tensors, in neither model as
    written, are not compared, nor is the call's output, whose type
    amp-convert does not infer."""
    path = _low_function_model(tmp_path / "m.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main([str(path), "-o", str(out), "-q", "--provider", "cpu", "--report", str(report)]) == 0
    v = json.loads(report.read_text())["validation"]
    assert v["emulated"] and v["reference_emulated"] and v["passed"]
    assert [n["name"] for n in v["nodes"]] == ["to16", "to32"]
    assert all(n["error_after"] == 0 for n in v["nodes"]) and all(o["max_abs_err"] == 0 for o in v["outputs"])
    assert main(["compare", str(path), str(path), "-q", "--provider", "cpu"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("function_opset", [13, 16, 18])
def test_a_local_function_at_another_opset_than_the_models_validates_through_the_twin(tmp_path, capsys, function_opset):
    """A local function may import another default-domain opset than the
    model where each node of its body has the same schema at both (here
    13, 16 or 18 in a model at 17). onnx inlines no such function: the
    twin left it a call, whose fp16 Constant met the twin's float32 input,
    and onnxruntime refused the twin (exit 3, "--emulate never validates
    without it"). The twin reads the body at the model's opset, where it
    means the same, and inlines it."""
    path = _low_function_model(tmp_path / "m.onnx", function_opset=function_opset)
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main([str(path), "-o", str(out), "-q", "--provider", "cpu", "--report", str(report)]) == 0
    v = json.loads(report.read_text())["validation"]
    assert v["emulated"] and v["reference_emulated"] and v["passed"]
    assert main(["compare", str(path), str(path), "-q", "--provider", "cpu"]) == 0
    capsys.readouterr()


def test_an_emulation_twin_onnxruntime_cannot_load_is_amp_converts_failure_not_the_models(tmp_path):
    """Where onnxruntime refuses a model's emulation twin but loads the
    model as written, the failure is amp-convert's (exit 3), named as the
    twin's with the way round it; it was reported as the input model's
    (exit 2: "the input model cannot be loaded by onnxruntime"), and
    compare blamed the candidate file "where" the reference, the same file,
    "runs". A local function whose body means something else at the
    model's opset (a Mul at 13: see _low_function_model) stays a call in
    the twin, and its fp16 Constant meets the twin's float32 input. onnx's
    checker refuses such a model, so the command line never validates one:
    it is validated here as the API does, its failures reported as the
    command reports them."""
    from dataclasses import replace

    from amp_convert.blame import run_failures
    from amp_convert.errors import ConversionError
    from amp_convert.inputs import make_source
    from amp_convert.validation import ValidationConfig, validate

    path = _low_function_model(tmp_path / "m.onnx", function_opset=13, op="Mul")
    m = onnx.load(str(path))
    source, cpu = make_source(m), ValidationConfig(provider="cpu")
    twin = r"onnxruntime cannot load the emulation twin of {} .* loads {} as written; `emulate` never .*tensor\(float16\)"
    with pytest.raises(ConversionError, match=twin.format(*["the converted model"] * 2)), run_failures(source):
        validate(m, m, source, cpu)
    with pytest.raises(ConversionError, match=twin.format(*[re.escape(str(path))] * 2)), run_failures(source, (str(path),) * 2):
        validate(m, m, source, cpu)
    assert validate(m, m, source, replace(cpu, emulate="never")).passed


def _scaling_function_model(path: Path, low: bool, how: str) -> Path:
    """x -> Relu -> a call of the model's local function local::Scale ->
    y, the main graph all float32. Scale casts its input to its dtype
    (float32, or fp16 where ``low``: x above 65.5 then overflows),
    multiplies by 1000 and by 0.001 in it, and casts back. ``how`` its
    Cast is told the dtype: "cast" (written in), "attribute" (the call's
    attribute dtype, which the body refers to), "nested" (Scale calls
    local::Inner, the body that casts)."""
    from onnx import TensorProto, helper, numpy_helper

    dtype, numpy = (TensorProto.FLOAT16, np.float16) if low else (TensorProto.FLOAT, np.float32)
    cast = helper.make_node("Cast", ["a"], ["c"])
    if how == "attribute":
        cast.attribute.append(helper.make_attribute_ref("to", onnx.AttributeProto.INT, ref_attr_name="dtype"))
    else:
        cast.attribute.append(helper.make_attribute("to", dtype))
    body = [cast]
    for k, (tensor, factor) in enumerate((("c", 1000), ("m", 0.001))):
        body.append(helper.make_node("Constant", [], [f"f{k}"], value=numpy_helper.from_array(np.array(factor, numpy))))
        body.append(helper.make_node("Mul", [tensor, f"f{k}"], ["mn"[k]]))
    body.append(helper.make_node("Cast", ["n"], ["o"], to=TensorProto.FLOAT))
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    attributes = ["dtype"] if how == "attribute" else []
    inner = helper.make_function("local", "Scale", ["a"], ["o"], body, opset_imports=imports, attributes=attributes)
    functions = [inner]
    if how == "nested":
        inner.name = "Inner"
        outer = [helper.make_node("Inner", ["a"], ["o"], domain="local")]
        functions.insert(0, helper.make_function("local", "Scale", ["a"], ["o"], outer, opset_imports=imports))
    call = helper.make_node("Scale", ["r"], ["y"], name="call", domain="local", **{a: dtype for a in attributes})
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), call],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    m = helper.make_model(graph, opset_imports=imports, functions=functions)
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("how", ["cast", "attribute", "nested"])
def test_a_model_whose_only_fp16_is_in_a_local_function_is_emulated_and_its_overflow_fails(tmp_path, how):
    """A candidate whose main graph is float32 but whose local function
    computes in fp16 is low precision: validation took it for a float32
    one ("the candidate has no fp16/bf16 tensors") and ran it as written,
    where onnxruntime's CPU provider hides the overflow of x * 1000 in
    fp16, and passed it. It runs through its emulation twin, whose inlined
    body rounds: x above 65.5 overflows, and the new Inf values fail it."""
    ref, cand = (_scaling_function_model(tmp_path / f"{name}.onnx", low, how) for name, low in (("r", False), ("c", True)))
    report = tmp_path / "r.json"
    args = ["compare", str(ref), str(cand), "-q", "--provider", "cpu", "--input-range", "x=50:100", "--report", str(report)]
    assert main(args) == 1
    v = json.loads(report.read_text())["validation"]
    assert v["emulated"] and not v["reference_emulated"] and not v["passed"]
    assert v["outputs"][0]["new_nonfinite"] > 0


def test_an_unused_sparse_initializer_of_a_name_the_inliner_makes_leaves_the_twin_loadable(tmp_path):
    """onnx's inliner makes the names of an inlined body's tensors unique
    against the graph's dense initializers, not its sparse ones: the
    body's Constant k became k__1, the name of an unused sparse
    initializer, and onnxruntime refused the twin ("Shape of initializer
    k__1 does not match"; exit 3)."""
    from onnx import helper, numpy_helper

    path = _low_function_model(tmp_path / "m.onnx")
    m = onnx.load(str(path))
    values, indices = numpy_helper.from_array(np.ones(1, np.float32), "k__1"), numpy_helper.from_array(np.zeros(1, np.int64))
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    onnx.save(m, str(path))
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main([str(path), "-o", str(out), "-q", "--provider", "cpu", "--report", str(report)]) == 0
    v = json.loads(report.read_text())["validation"]
    assert v["emulated"] and v["reference_emulated"] and v["passed"]


def test_a_local_function_passing_an_input_out_is_the_input_models_failure(tmp_path, capsys):
    """A local function whose output is one of its inputs is valid ONNX,
    but onnxruntime 1.31 refuses the model as written (onnx's inliner also
    drops the pass, leaving the call's output made by no node, so the twin
    cannot be right either): the input model is named as the one
    onnxruntime cannot load (exit 2), not the twin."""
    from onnx import TensorProto, helper

    body = [helper.make_node("Neg", ["a"], ["o"])]
    function = helper.make_function("local", "Pass", ["a"], ["a", "o"], body, opset_imports=[helper.make_opsetid("", 17)])
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("Pass", ["x16"], ["p16", "n16"], domain="local"),
        helper.make_node("Add", ["p16", "n16"], ["s16"]),
        helper.make_node("Cast", ["s16"], ["y"], to=TensorProto.FLOAT),
    ]
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [4]) for name in "xy")
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets, functions=[function])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert main([str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q", "--provider", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "the input model cannot be loaded by onnxruntime: " in err and "twin" not in err


def _overcalling_model(where: str, kind: str) -> onnx.ModelProto:
    """x -> a call of local::F (Neg: one input, one output) with one
    ``kind`` ("inputs" or "outputs") more than F declares -> Relu -> y. The
    call is in the main graph, in the then branch of an If (``where``:
    "branch"), or in the body of local::Outer, which the main graph calls
    ("body"; "uncalled": Outer is declared, never called). onnx's checker
    passes every one."""
    from onnx import TensorProto, helper

    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    f = helper.make_function("local", "F", ["a"], ["o"], [helper.make_node("Neg", ["a"], ["o"])], opset_imports=opsets[:1])
    ins, outs = (["a", "a"], ["o"]) if kind == "inputs" else (["a"], ["o", "p"])
    call = helper.make_node("F", ins, outs, domain="local")
    outer = helper.make_function("local", "Outer", ["a"], ["o"], [call], opset_imports=opsets)
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [4]) for name in "xy")
    inputs, functions = [x], [f, outer]
    if where in ("body", "uncalled"):
        first = helper.make_node("Outer" if where == "body" else "F", ["x"], ["z"], domain="local")
    elif where == "main":
        first = helper.make_node("F", [x.name if n == "a" else n for n in ins], ["z", *outs[1:]], domain="local")
    else:
        branch = helper.make_node("F", ["x"] * len(ins), ["z", *outs[1:]], domain="local")
        then = helper.make_graph([branch], "then", [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
        other = helper.make_graph(
            [helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])]
        )
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        first = helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other)
    graph = helper.make_graph([first, helper.make_node("Relu", ["z"], ["y"])], "g", inputs, [y])
    m = helper.make_model(graph, opset_imports=opsets, functions=functions)
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("kind", ["inputs", "outputs"])
@pytest.mark.parametrize(
    ("where", "call"),
    [
        ("main", "node 'F_0'"),
        ("branch", "node 'F_0' in then_branch of node 'If_0'"),
        ("body", "node 'F_0' in the body of local::Outer"),
    ],
)
def test_a_call_of_a_local_function_with_more_inputs_or_outputs_than_it_declares_is_the_inputs_failure(
    tmp_path, capsys, where, call, kind
):
    """onnx's checker passes a call of a local function with more inputs
    or outputs than the function declares; onnxruntime refuses the model,
    and onnx's inliner, which the emulation twin uses, raised a
    RuntimeError: "internal error" (exit 3), also where a model that does
    not load falls back to the twin. The input is refused as it is read,
    by every command (--no-validate would write a model no runtime loads):
    exit 2, naming the call and the function, nothing written."""
    path = tmp_path / "m.onnx"
    onnx.save(_overcalling_model(where, kind), str(path))
    out = tmp_path / "o.onnx"
    said = f"{path}: {call} calls local function local::F with 2 {kind}, but it declares 1"
    for args in ([str(path), "-o", str(out)], [str(path), "-o", str(out), "--no-validate"], ["compare", str(path), str(path)]):
        assert main([*args, "-q", "--provider", "cpu"]) == 2
        err = capsys.readouterr().err
        assert said in err and "internal error" not in err and err.count("\n") == 1
        assert not out.exists()
    with pytest.raises(AmpError, match=re.escape(said.replace(f"{path}: ", "model: "))):
        convert(_overcalling_model(where, kind))


def test_a_function_no_node_calls_may_hold_a_call_of_any_arity(tmp_path):
    """A function that nothing calls is not run: onnxruntime loads a model
    whose uncalled function calls another with an input too many, and so
    does amp-convert."""
    path = tmp_path / "m.onnx"
    onnx.save(_overcalling_model("uncalled", "inputs"), str(path))
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--provider", "cpu"]) == 0


def test_a_model_whose_twin_and_itself_onnxruntime_cannot_load_is_the_inputs_failure(tmp_path, capsys):
    """The twin refused and the model as written too (an IR version newer
    than onnxruntime reads): the input model is to blame, exit 2."""
    path = _low_function_model(tmp_path / "m.onnx", ir_version=14)
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--provider", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "the input model cannot be loaded by onnxruntime: " in err and "twin" not in err


def test_the_library_names_fields_where_the_command_prints_their_flags(resnet, tmp_path, capsys):
    """A per-node reason (the --keep-fp32 pattern) and a hint (the bf16
    --target-opset upgrade) name the option's field in the plan the library
    returns, and the command prints them with the flag."""
    plan = convert(onnx.load(str(resnet)), level="O2", dtype="bf16", keep_fp32=["^/conv1/"]).plan
    assert plan.by_name("/conv1/Conv").reason == "`keep_fp32` '^/conv1/'"
    [hint] = plan.hints
    assert "; `target_opset` 22 upgrades the model" in hint
    schema = plan.by_name("/layer1/layer1.0/conv1/Conv").reason
    assert "it does from opset 22 (`target_opset` 22)" in schema
    args = [str(resnet), "--dtype", "bf16", "--keep-fp32", "^/conv1/", "--explain", "--no-validate"]
    assert main([*args, "-o", str(tmp_path / "o.onnx")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("main ")}
    assert rows["/conv1/Conv"].endswith("  --keep-fp32 '^/conv1/'")
    assert rows["/layer1/layer1.0/conv1/Conv"].endswith(schema.replace("`target_opset`", "--target-opset"))
    assert "hint: " + hint.replace("`target_opset`", "--target-opset") in out.splitlines()
    assert "`" not in out


def test_a_bf16_plan_that_keeps_convs_fp32_for_the_opset_says_so_beside_the_summary(resnet, tmp_path):
    """Below opset 22 the schemas admit no bf16 Conv: the summary line alone
    (14 of 53 nodes low) does not say why or what to do; a hint line does,
    and goes once the model is upgraded."""
    old = cli(str(resnet), "--dtype", "bf16", "--no-validate", "-o", str(tmp_path / "a.onnx"))
    assert old.returncode == 0, old.stderr
    [hint] = [line for line in old.stdout.splitlines() if line.startswith("hint: ")]
    assert "Conv" in hint and "opset 17" in hint and "--target-opset 22" in hint
    new = cli(str(resnet), "--dtype", "bf16", "--no-validate", "--target-opset", "22", "-o", str(tmp_path / "b.onnx"))
    assert new.returncode == 0, new.stderr
    assert "hint: " not in new.stdout
    assert "hint: " not in cli(str(resnet), "--dtype", "bf16", "--no-validate", "-q", "-o", str(tmp_path / "c.onnx")).stdout


def test_a_model_onnxruntime_cannot_load_is_named_as_the_input_or_the_compared_file(tmp_path, capsys):
    """An input of an IR version newer than onnxruntime reads: validation
    names the input model as the one onnxruntime cannot load (exit 2, no
    samples to blame); compare names the file."""
    path = _reshape_model(tmp_path / "m.onnx", (8, 4), [2, 4, 4])
    newer = onnx.load(str(path))
    newer.ir_version = 14  # (onnx 1.23 writes it; onnxruntime 1.31 reads up to 13)
    onnx.save(newer, str(tmp_path / "newer.onnx"))
    assert main([str(tmp_path / "newer.onnx"), "-o", str(tmp_path / "o.onnx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "the input model cannot be loaded by onnxruntime: " in err and "generated" not in err
    assert not (tmp_path / "o.onnx").exists()
    assert main(["compare", str(path), str(tmp_path / "newer.onnx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'newer.onnx'} cannot be loaded by onnxruntime where {path} runs" in err


def _newer_model(tmp_path: Path) -> Path:
    """A valid model of an IR version newer than onnxruntime reads (onnx 1.23 writes 14; onnxruntime 1.31 reads up to 13)."""
    path = _reshape_model(tmp_path / "newer.onnx", (8, 4), [2, 4, 4])
    newer = onnx.load(str(path))
    newer.ir_version = 14
    onnx.save(newer, str(path))
    return path


@pytest.mark.parametrize(
    "options",
    [
        ["--no-safety"],
        ["--level", "O3"],
        ["--no-safety", "--no-per-node"],
        ["--no-safety", "--emulate", "never"],
        ["--no-safety", "--dtype", "bf16"],
        ["--level", "O0"],
        ["--target-opset", "18"],
    ],
)
def test_an_input_onnxruntime_cannot_load_is_named_where_nothing_loaded_it_first(tmp_path, capsys, options):
    """Without the safety rules' calibration run nothing loads the input
    before the converted model: the converted model's load check (fp16),
    or validation's session of the candidate (bf16 on the CPU, O0), met
    onnxruntime's refusal first and blamed the conversion ('one of its
    graph optimizations fails on it', exit 3); the probe of
    --target-opset's opset, at the input's IR version, blamed the option.
    The input, which onnxruntime refuses as well, is named, as where the
    calibration run loads it first (exit 2, nothing written)."""
    path = _newer_model(tmp_path)
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--provider", "cpu", *options]) == 2
    err = capsys.readouterr().err
    assert "the input model cannot be loaded by onnxruntime: " in err and "IR version" in err
    assert "converted" not in err and "--target-opset" not in err and "internal error" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_a_converted_model_onnxruntime_cannot_load_is_still_the_conversions_where_the_input_loads(tmp_path, capsys):
    """The input is loaded only where the converted model does not load,
    to tell whose failure it is: at O1 without the safety rules, the
    decomposed LayerNorm's Cast makes onnxruntime 1.31's LayerNormFusion
    refuse the converted model, and the input loads (exit 3)."""
    from models.hostile import layernorm_large_sums

    path = tmp_path / "ln.onnx"
    onnx.save(layernorm_large_sums(), str(path))
    args = [str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--provider", "cpu", "--level", "O1", "--no-safety"]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "cannot load the converted model on cpu, which is valid ONNX" in err
    assert not (tmp_path / "o.onnx").exists()


def test_compare_of_two_models_onnxruntime_cannot_load_says_neither_loads(tmp_path, capsys):
    """The candidate's session is built first: where it failed, compare
    said the candidate cannot be loaded 'where' the reference 'runs', which
    onnxruntime refuses as well. Neither loads: both are named (exit 2)."""
    newer = _newer_model(tmp_path)
    other = tmp_path / "other.onnx"
    other.write_bytes(newer.read_bytes())
    assert main(["compare", str(newer), str(other), "-q", "--provider", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"neither {newer} nor {other} can be loaded by onnxruntime: " in err and "IR version" in err
    assert " runs" not in err and err.count("\n") == 1
    fine = _reshape_model(tmp_path / "fine.onnx", (8, 4), [2, 4, 4])
    assert main(["compare", str(newer), str(fine), "-q", "--provider", "cpu"]) == 2
    assert f"{newer} cannot be loaded by onnxruntime: " in capsys.readouterr().err
