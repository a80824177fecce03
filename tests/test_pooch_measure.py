"""``pooch-ext profile --measure``: a measured profile of a named network, from the CLI."""
from __future__ import annotations

import json

from pooch_ext.cli import main
from pooch_ext.profile import Profile


def test_measure_writes_a_loadable_measured_profile(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "--measure", "--model", "small-resnet", "--batch", "2",
                 "--iters", "2", "--budget", "4MiB", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["source"] == "measured" and summary["capacity_bytes"] == 4 * 2**20
    profile = Profile.load(out)
    assert profile.meta["model"] == "small-resnet" and profile.meta["batch"] == 2
    assert profile.meta["input_size"] == [3, 32, 32] and profile.device.kind == "cpu"
    assert len(profile.feature_maps) > 0 and (profile.ops.duration_s > 0).all()


def test_measure_errors_are_one_line(capsys):
    assert main(["profile", "--measure", "--model", "small-resnet", "--batch", "2",
                 "--budget", "1KiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pooch-ext profile: error: budget 1 KiB is below the minimum")
    assert "\n" not in err
    assert main(["profile", "--model", "small-resnet", "--batch", "2", "--budget", "1GiB"]) == 2
    assert "--budget applies to --measure only" in capsys.readouterr().err
