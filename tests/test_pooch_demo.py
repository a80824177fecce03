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


def test_on_a_gpu_the_demo_lets_the_pool_take_headroom_and_says_so(monkeypatch, capsys):
    """On a GPU a budget does not hold yet (H200, session 30): the demo gives CuPy's pool
    headroom for the run, says so, leaves a headroom the user set alone, and puts the
    environment back after; on the CPU device it changes nothing."""
    import os

    from pooch_ext import demo

    monkeypatch.delenv("POOCH_GPU_POOL_HEADROOM", raising=False)
    with demo._gpu_pool_headroom(False):
        assert "POOCH_GPU_POOL_HEADROOM" not in os.environ
    with demo._gpu_pool_headroom(True):
        assert os.environ["POOCH_GPU_POOL_HEADROOM"] == demo.GPU_POOL_HEADROOM
    assert "POOCH_GPU_POOL_HEADROOM" not in os.environ
    assert "a budget does not hold yet" in capsys.readouterr().err
    monkeypatch.setenv("POOCH_GPU_POOL_HEADROOM", "1.2")
    with demo._gpu_pool_headroom(True):
        assert os.environ["POOCH_GPU_POOL_HEADROOM"] == "1.2"
    assert os.environ["POOCH_GPU_POOL_HEADROOM"] == "1.2" and not capsys.readouterr().err


@pytest.mark.parametrize("measured, over", [(100, False), (101, True)])
def test_the_summary_says_when_the_peak_went_over_the_budget(measured, over, tmp_path, capsys):
    from types import SimpleNamespace

    from pooch_ext import demo

    summary = {"plain_iteration_s": 0.01, "pooch_iteration_s": 0.012,
               "measured_peak_bytes": measured, "predicted_peak_bytes": 99,
               "budget_bytes": 100, "bit_identical": True}
    plan = SimpleNamespace(policy="pooch", counts={"keep": 1, "swap": 2, "recompute": 0},
                           iteration_time_s=0.011)
    demo._print_summary(tmp_path, summary, plan)
    assert ("OVER the budget" in capsys.readouterr().out) is over
