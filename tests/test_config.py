"""Config files from the API: load_config reads the file ``--config`` reads
into the library's options, and a run from them writes what the command
writes with that file; keys and refusals are those of the command line."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import amp_convert as ac
from amp_convert.cli import cli, main
from amp_convert.cli_config import NOT_CONFIG
from amp_convert.cli_params import parameters
from amp_convert.config import config_keys

ZOO = Path(__file__).resolve().parent.parent / "models" / "zoo"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "amp.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_config_file_runs_from_the_api_as_the_command_runs_it(tmp_path):
    config = _write(
        tmp_path,
        'level = "O1"\ndtype = "bf16"\nwhite-list = "Add,Mul"\nkeep_fp32 = ["^/head/"]\nvalidate = false\n'
        f'output = "{tmp_path / "api.onnx"}"\nplan-json = "{tmp_path / "api.json"}"\nexplain = true\n',
    )
    loaded = ac.load_config(config)
    assert loaded.convert.level == "O1" and loaded.convert.dtype == "bf16"
    assert loaded.convert.white_list == ("Add", "Mul") and loaded.convert.keep_fp32 == ("^/head/",)
    assert loaded.validate is False and loaded.auto is None and loaded.display == {"explain": True}
    run = ac.convert_file(ZOO / "lstm.onnx", **loaded.arguments())
    assert run.written and run.output == tmp_path / "api.onnx"
    cli_out = tmp_path / "cli.onnx"
    args = [str(ZOO / "lstm.onnx"), "--config", str(config), "-o", str(cli_out), "--plan-json", str(tmp_path / "c.json")]
    assert main(args) == 0
    assert onnx.load(str(cli_out)).SerializeToString() == onnx.load(str(tmp_path / "api.onnx")).SerializeToString()
    assert (tmp_path / "c.json").read_text() == (tmp_path / "api.json").read_text()


def test_a_table_and_the_auto_level(tmp_path):
    loaded = ac.load_config(_write(tmp_path, '[amp-convert]\nlevel = "auto"\nmax-trials = 3\nsamples = 1\natol = 1\n'))
    assert loaded.convert.level is None and loaded.auto == ac.AutoOptions(max_trials=3)
    assert loaded.validation.samples == 1 and loaded.validation.atol == 1
    assert loaded.given == {"level", "max_trials", "samples", "atol"}


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ('lvel = "O1"', ac.UsageError, "amp.toml: unknown option 'lvel'"),
        ("samples = 1.5", ac.UsageError, "amp.toml: `samples` must be an integer, got 1.5"),
        ("safety = 1", ac.UsageError, "amp.toml: `safety` must be true or false, got 1"),
        ('level = "O9"', ac.UsageError, "amp.toml: unknown `level` 'O9': use one of O0, O1, O2, O3"),
        ("seed = -1", ac.UsageError, "amp.toml: `seed` must be an integer >= 0, got -1"),
        ('level = "O1"\n[amp-convert]\ndtype = "bf16"', ac.UsageError, "'level' is outside the [amp-convert] table"),
        ("level = ", ac.InputError, "amp.toml: malformed TOML"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_file_and_the_field(tmp_path, text, error, message):
    with pytest.raises(error) as caught:
        ac.load_config(_write(tmp_path, text))
    assert message in str(caught.value) and type(caught.value) is error


def test_a_missing_config_file_is_an_input_error(tmp_path):
    with pytest.raises(ac.InputError, match="no such file"):
        ac.load_config(tmp_path / "none.toml")


def test_the_library_takes_the_keys_the_command_line_takes():
    """One set of keys: the command's options (from its click parameters) are the library's fields."""
    command = {key for key in parameters(cli.commands["convert"]) if key not in NOT_CONFIG}
    assert config_keys() == command
