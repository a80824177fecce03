"""``python -m pooch_ext.demo`` end to end, small: every artefact written, training exact."""
from __future__ import annotations

import json

import pytest

from pooch_ext.demo import main, teacher_batches
from pooch_ext.profile import Profile


@pytest.mark.slow
def test_demo_writes_its_results_and_trains_bit_identically(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--iters", "6", "--batch", "4", "--profile-iters", "2", "--cpu",
                 "--out", str(out)]) == 0
    for name in ("plan.csv", "iterations.csv", "allocations.csv", "losses.csv", "loss.png", "timeline.png",
                 "summary.json"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bit_identical"] is True and summary["policy"] == "pooch"
    assert summary["minimum_budget_bytes"] <= summary["budget_bytes"] < summary["incore_need_bytes"]
    assert summary["measured_peak_bytes"] <= summary["budget_bytes"]
    assert Profile.load(out / "profile").meta["source"] == "measured"
    assert "bit-identical to plain Chainer: True" in capsys.readouterr().out


def test_teacher_labels_vary_and_batches_cycle():
    batches = teacher_batches(10, 16, (3, 8, 8), 10, distinct=4)
    assert batches[4][0] is batches[0][0]
    assert len(set(batches[0][1].tolist())) > 2


def test_too_few_iterations_for_a_planned_one_are_refused_up_front(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--iters", "3", "--profile-iters", "2", "--cpu"])
    assert exit_info.value.code == 2
    assert "--iters must be at least --profile-iters + 2" in capsys.readouterr().err
