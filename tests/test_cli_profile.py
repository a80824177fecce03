"""pooch-ext profile: writes a loadable analytic profile, prints a summary, one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pooch_ext.analytic.tracing import analytic_profile
from pooch_ext.cli import main
from pooch_ext.profile import Profile


def test_profile_json_and_saved_folder(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "--model", "small-resnet", "--batch", "4", "--gpu", "h200",
                 "--link", "c2c", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    expected = analytic_profile("small-resnet", 4, gpu="h200", link="c2c")
    for key in ("ops", "tensors", "incore_peak_bytes", "feature_map_bytes", "resident_bytes"):
        assert summary[key] == expected.summary()[key]
    assert summary["input_size"] == "3x32x32" and summary["device"] == "h200"
    assert Profile.load(out) == expected


def test_profile_text_summary(capsys):
    assert main(["profile", "--model", "resnet50", "--batch", "256"]) == 0
    text = capsys.readouterr().out
    assert "in-core peak" in text and "needs out-of-core" in text
    assert len(text.splitlines()) <= 12
    # the op count's one beyond forward + backward is named (a user trial could not place it)
    assert "ops              353 (176 forward, 176 backward, the optimizer update)" in text
    assert main(["profile", "--model", "resnext101-3d", "--batch", "1",
                 "--input-size", "16x64x64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_size"] == "3x16x64x64"


def test_a_device_without_a_memory_limit_says_so_instead_of_a_capacity():
    """The CPU device without a budget reports a huge capacity (``UNLIMITED``); a user trial
    read "device cpu, 1 PiB" in ``pooch-ext profile --measure``."""
    from pooch_ext.commands.profile import summary_lines
    from pooch_ext.units import UNLIMITED

    summary = analytic_profile("small-resnet", 4).summary()
    assert ", no memory limit;" in summary_lines({**summary, "capacity_bytes": UNLIMITED})[1]
    assert "no memory limit" not in summary_lines(summary)[1]


@pytest.mark.parametrize("args, message", [
    (["--model", "lenet", "--batch", "2"], "unknown model 'lenet'"),
    (["--model", "small-resnet", "--batch", "0"], "batch must be a positive integer"),
    (["--model", "small-resnet", "--batch", "2", "--input-size", "3x"], "not a size"),
    (["--model", "small-resnet", "--batch", "2", "--gpu", "k80"], "unknown GPU 'k80'"),
    (["--model", "small-resnet", "--batch", "2", "--link", "usb"], "unknown link 'usb'"),
    (["--model", "alexnet", "--batch", "2", "--input-size", "160x160"], "input features"),
    # options for the other kind of profile had been ignored silently (a user trial)
    (["--model", "small-resnet", "--batch", "2", "--iters", "5"],
     "--iters applies to --measure only"),
    (["--model", "small-resnet", "--batch", "2", "--measure", "--gpu", "h100"],
     "--gpu applies to the analytic profile only"),
    (["--model", "small-resnet", "--batch", "2", "--measure", "--conv", "cudnn"],
     "--conv applies to the analytic profile only"),
])
def test_bad_input_is_one_line_error(args, message, capsys):
    assert main(["profile", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_batch_type_and_real_entry_point():
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--model", "small-resnet", "--batch", "two"])
    assert exit_info.value.code == 2
    done = subprocess.run([sys.executable, "-m", "pooch_ext.cli", "profile", "--model",
                           "small-resnet", "--batch", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0
