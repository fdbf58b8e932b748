"""The command line's option groups, shared by the commands (as Polygraphy's
tools share argument groups), and the library options they parse into."""

from __future__ import annotations

from dataclasses import fields

import click

from .cli_config import load_config
from .cli_params import TOLERANCE, Finite, Quantile, file_path, only_list, parameters, split_ops
from .lists import LEVELS, PROFILES
from .options import EMULATE_MODES, ERROR_STATS, IO_TYPES, PROVIDERS, ConvertOptions, ValidationOptions


def output_option(f):
    """-o / --output: the converted model's path."""
    return click.option(
        "-o",
        "--output",
        type=click.Path(),
        callback=file_path,
        default=None,
        help="Output file (default: MODEL with a .fp16/.bf16 suffix). Example: -o out.onnx",
    )(f)


def conversion_options(f):
    """Options that decide the plan (shared by convert and lists)."""
    options = [
        click.option(
            "--level",
            type=click.Choice([*LEVELS, "auto"]),
            default=None,
            help="O0 no change; O1 only white-list ops low; O2 all but black-list ops low (default); O3 everything low; "
            "auto: the most low precision that meets the tolerance, found by measurement. Example: --level O1",
        ),
        click.option(
            "--dtype",
            type=click.Choice(["fp16", "bf16"]),
            default="fp16",
            show_default=True,
            help="Low-precision type. Example: --dtype bf16",
        ),
        click.option(
            "--lists",
            "lists_profile",
            type=click.Choice(PROFILES),
            default="default",
            show_default=True,
            help="Built-in list profile: ours, MindSpore's or Paddle's, mapped to ONNX ops. Example: --lists mindspore",
        ),
        click.option(
            "--white-list",
            multiple=True,
            metavar="OPS",
            help="Add op types to the white list (Paddle custom_white_list). Example: --white-list Add,Mul",
        ),
        click.option(
            "--black-list",
            multiple=True,
            metavar="OPS",
            help="Add op types to the black list (Paddle custom_black_list). Example: --black-list Softmax",
        ),
        click.option(
            "--only-white-list",
            multiple=True,
            metavar="OPS",
            help="Replace the white list; only these run low, as O1 (MindSpore custom_mixed_precision). "
            "Example: --only-white-list Conv,MatMul",
        ),
        click.option(
            "--only-black-list",
            multiple=True,
            metavar="OPS",
            help="Replace the black list; all but these run low, as O2. Example: --only-black-list LayerNormalization",
        ),
        click.option(
            "--keep-batchnorm-fp32/--no-keep-batchnorm-fp32",
            default=None,
            help="Keep BatchNormalization in fp32 (default: yes at O2, no at O3). Example: --no-keep-batchnorm-fp32",
        ),
        click.option(
            "--fold-batchnorm/--no-fold-batchnorm",
            default=True,
            show_default=True,
            help="Fold each BatchNormalization kept fp32 into the Conv before it, in fp32, so that no Cast pair "
            "blocks onnxruntime's fusions. Example: --no-fold-batchnorm",
        ),
    ]
    return _decorated(f, options)


def convert_only_options(f):
    """Options of the convert command alone: pins, I/O types, safety, auto, the target, what is written."""
    options = [
        click.option(
            "--keep-fp32",
            multiple=True,
            metavar="REGEX",
            help="Keep nodes whose name matches fp32 (repeatable; beats the lists). Example: --keep-fp32 '^head/'",
        ),
        click.option(
            "--force-low",
            multiple=True,
            metavar="REGEX",
            help="Run nodes whose name matches low (repeatable; beats lists and safety, not the schema). "
            "Example: --force-low 'attn'",
        ),
        click.option(
            "--io-types",
            type=click.Choice(IO_TYPES),
            default="keep",
            show_default=True,
            help="keep: graph inputs/outputs stay fp32; low: they take the low dtype. Example: --io-types low",
        ),
        click.option(
            "--safety/--no-safety",
            default=None,
            help="Safety rules (on at O1, O2 and auto; off at O3): keep nodes fp32 whose constants or fp32-run values the "
            "low dtype cannot hold. Example: --no-safety",
        ),
        click.option(
            "--initializer-range/--no-initializer-range",
            default=True,
            show_default=True,
            help="The constants rule of --safety. Example: --no-initializer-range",
        ),
        click.option(
            "--clip-initializers",
            is_flag=True,
            help="Clip out-of-range constants (counted in the report) instead of keeping their nodes fp32. "
            "Example: --clip-initializers",
        ),
        click.option(
            "--data-max",
            type=Finite("float", 0.0, above=True),
            default=None,
            help="Calibrated rule: nodes whose fp32 values exceed this stay fp32 (default: half the dtype's max). "
            "Example: --data-max 10000",
        ),
        click.option(
            "--calibration",
            multiple=True,
            metavar="PATH",
            help="Samples for the calibrated rule (default: the validation inputs); same formats as --inputs. "
            "Example: --calibration calib/",
        ),
        click.option(
            "--max-trials",
            type=click.IntRange(1, 1000),
            default=8,
            show_default=True,
            help="--level auto: most conversions + validations to try. Example: --max-trials 12",
        ),
        click.option(
            "--auto-from",
            type=click.Choice(["O1", "O2"]),
            default=None,
            help="--level auto: grow from a list level instead of shrinking from O3. Example: --auto-from O2",
        ),
        click.option(
            "--target-provider",
            type=str,
            default="cuda",
            show_default=True,
            help="The onnxruntime execution provider the model will run on: a node runs low only where it has a kernel for "
            "that op in the low dtype (cuda, cpu, or none for no filtering). Example: --target-provider cpu",
        ),
        click.option(
            "--target-opset",
            type=int,
            default=None,
            help="Upgrade the model to this default-domain opset first (bf16 Conv/MatMul need 22). Example: --target-opset 22",
        ),
        click.option(
            "--external-data",
            type=click.Choice(["auto", "always", "never"]),
            default="auto",
            show_default=True,
            help="Write large tensors to OUT.data beside the model: auto when the input used external data or the "
            "result is over 2 GB. Example: --external-data always",
        ),
        click.option(
            "--check",
            type=click.Choice(["full", "basic", "none"]),
            default="full",
            show_default=True,
            help="ONNX checker run on the result. Example: --check basic",
        ),
        click.option("--explain", is_flag=True, help="Print the plan: node, op, precision, reason. Example: --explain"),
        click.option(
            "--plan-json",
            type=click.Path(),
            callback=file_path,
            default=None,
            help="Write the plan as JSON. Example: --plan-json plan.json",
        ),
        click.option(
            "--validate/--no-validate",
            default=True,
            show_default=True,
            help="Check the result's numerics against the fp32 model. Example: --no-validate",
        ),
        click.option(
            "--write-on-fail",
            is_flag=True,
            help="Write the model even when it is out of tolerance (exit code stays 1). Example: --write-on-fail",
        ),
    ]
    return _decorated(f, options)


def validation_options(f):
    """Options that decide how numerics are checked (shared by convert and compare)."""
    options = [
        click.option(
            "--provider",
            type=click.Choice(PROVIDERS),
            default="auto",
            show_default=True,
            help="onnxruntime provider: CUDA when a GPU is usable, else CPU. Example: --provider cpu",
        ),
        click.option(
            "--emulate",
            type=click.Choice(EMULATE_MODES),
            default="auto",
            show_default=True,
            help="Round to the low dtype at every low tensor with fp32 kernels (auto: on CPU). Example: --emulate always",
        ),
        click.option(
            "--inputs",
            multiple=True,
            metavar="PATH",
            help="Validation samples: .npz files, a folder of them, or Polygraphy input JSON (repeatable). "
            "Example: --inputs samples/",
        ),
        click.option(
            "--input-shape",
            multiple=True,
            metavar="NAME=DIMS",
            help="Shape for generated inputs with dynamic dims. Example: --input-shape input_ids=1x128",
        ),
        click.option(
            "--input-range",
            multiple=True,
            metavar="NAME=LOW:HIGH",
            help="Value range for generated inputs (integers: [LOW, HIGH)). Example: --input-range input_ids=0:30522",
        ),
        click.option("--samples", type=int, default=2, show_default=True, help="Generated samples. Example: --samples 8"),
        click.option(
            "--seed",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Seed for generated inputs. Example: --seed 3",
        ),
        click.option(
            "--atol", type=TOLERANCE, default=None, help="Absolute tolerance (fp16 1e-3, bf16 1e-2). Example: --atol 1e-2"
        ),
        click.option(
            "--rtol",
            type=TOLERANCE,
            default=None,
            help="Tolerance relative to the output's largest value (fp16 1e-2, bf16 5e-2). Example: --rtol 2e-2",
        ),
        click.option(
            "--min-cosine",
            type=Finite("float", -1.0, 1.0),
            default=None,
            help="Least cosine similarity per output (fp16 0.999, bf16 0.99). Example: --min-cosine 0.995",
        ),
        click.option(
            "--check-error-stat",
            type=click.Choice(ERROR_STATS),
            default=None,
            help="The statistic of each output's absolute errors held to atol + rtol * max|fp32| (default max: every "
            "value). Example: --check-error-stat median",
        ),
        click.option(
            "--error-quantile",
            type=Quantile(),
            default=None,
            help="The quantile, in (0, 1], that --check-error-stat quantile judges (default 0.99). "
            "Example: --error-quantile 0.999",
        ),
        click.option(
            "--tolerance",
            "tolerances",
            multiple=True,
            metavar="NAME:FIELD=VALUE,...",
            help="A tolerance of its own for output NAME (fields atol, rtol, min_cosine, min_top1, error_stat, "
            "quantile; the others keep the run's), repeatable. Example: --tolerance probs:atol=0.02,min_top1=0.999",
        ),
        click.option(
            "--min-top1",
            type=Finite("float", 0.0, 1.0),
            default=None,
            help="Least share of rows whose argmax along the last axis agrees with fp32's, for float outputs whose "
            "last axis has 2 or more entries (default: reported, not judged). Example: --min-top1 0.999",
        ),
        click.option(
            "--per-node/--no-per-node",
            default=None,
            help="Compare every intermediate tensor to find where error enters (default: on up to 20,000 tensors). "
            "Example: --no-per-node",
        ),
        click.option(
            "--pin-choices/--no-pin-choices",
            default=True,
            show_default=True,
            help="Feed the converted model the fp32 model's TopK / NonMaxSuppression / NonZero / ArgMax choices, so "
            "outputs after them compare values, not tie-breaks (its own choices are reported). Example: --no-pin-choices",
        ),
        click.option(
            "--top", type=click.IntRange(min=0), default=10, show_default=True, help="Offending nodes to list. Example: --top 20"
        ),
        click.option(
            "--report",
            type=click.Path(),
            callback=file_path,
            default=None,
            help="Write the JSON report. Example: --report report.json",
        ),
        click.option(
            "--html",
            type=click.Path(),
            callback=file_path,
            default=None,
            help="Write the HTML report. Example: --html report.html",
        ),
        click.option("--json", "json_out", is_flag=True, help="Print the JSON report to stdout. Example: --json"),
        click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors. Example: -q"),
        click.option("--debug", is_flag=True, help="Show a traceback on errors. Example: --debug"),
    ]
    return _decorated(f, options)


def _decorated(f, options: list):
    """``f`` with ``options`` in the order listed (click lists them in --help as applied, last first)."""
    for option in reversed(options):
        f = option(f)
    return f


def config_option(f):
    """--config: a TOML file of the command's options."""
    return click.option(
        "--config",
        type=click.Path(path_type=str),
        callback=load_config,
        is_eager=True,
        expose_value=False,
        help="TOML file with any of these options (flags given here override it). Example: --config amp.toml",
    )(f)


def to_convert_options(kw: dict) -> ConvertOptions:
    """The conversion options of a command's parsed values, as the library's ConvertOptions."""
    return ConvertOptions(
        level=None if kw["level"] == "auto" else kw["level"],
        dtype=kw["dtype"],
        lists=kw["lists_profile"],
        white_list=split_ops(kw["white_list"]),
        black_list=split_ops(kw["black_list"]),
        only_white_list=only_list(kw["only_white_list"]),
        only_black_list=only_list(kw["only_black_list"]),
        keep_fp32=tuple(kw["keep_fp32"]),
        force_low=tuple(kw["force_low"]),
        keep_batchnorm_fp32=kw["keep_batchnorm_fp32"],
        fold_batchnorm=kw["fold_batchnorm"],
        io_types=kw["io_types"],
        safety=kw["safety"],
        initializer_range=kw["initializer_range"],
        clip_initializers=kw["clip_initializers"],
        data_max=kw["data_max"],
        target_opset=kw["target_opset"],
        target_provider=kw["target_provider"].lower(),
    )


def to_validation_options(kw: dict) -> ValidationOptions:
    """The validation options group as the library's ValidationOptions (fields named as the options)."""
    params = parameters(click.get_current_context().command)
    given = {f.name: kw[params[f.name].name] for f in fields(ValidationOptions) if f.name in params}
    return ValidationOptions(**given)
