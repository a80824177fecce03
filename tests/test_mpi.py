"""PoocH under ChainerMN on 2 and 4 processes (issue 17): `make test-mpi` runs these under
mpiexec (the `mpi` extra); `make test` leaves them out. Each case is a real data-parallel run
on the CPU device: plain ChainerMN against PoocH(comm=comm), refusals, ranks that disagree."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def _mpi_missing() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install '.[mpi]')"
    if not MPIEXEC.exists() and shutil.which("mpiexec") is None:
        return "no mpiexec (pip install mpich)"
    return ""


@pytest.fixture(autouse=True)
def mpi_present():
    missing = _mpi_missing()
    if missing and os.environ.get("POOCH_REQUIRE_MPI"):
        pytest.fail(missing)            # make test-mpi: MPI is part of the environment
    if missing:
        pytest.skip(missing)


def _mpiexec(n: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    command = [str(MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec")), "-n", str(n),
               sys.executable, *args]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _demo(n: int, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "summary.json"
    run = _mpiexec(n, "-m", "pooch_ext.demo_mpi", "--iters", "5", "--batch", "8",
                   "--json", str(out), *args)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "identical to plain ChainerMN" in run.stdout
    return json.loads(out.read_text())


@pytest.mark.parametrize("ranks, policy, fraction, profile_iters", [
    (2, "pooch", "0.03", "3"), (2, "superneurons", "0.1", "2"), (4, "superneurons", "0.1", "2")])
def test_every_rank_trains_bit_identical_to_plain_chainermn_on_one_plan(
        tmp_path, ranks, policy, fraction, profile_iters):
    # superneurons' fixed rules swap and recompute by themselves (and ignore a host budget)
    host = ["--no-host-budget"] if policy == "superneurons" else []
    summary = _demo(ranks, tmp_path, "--policy", policy, "--budget-fraction", fraction,
                    "--profile-iters", profile_iters, *host)
    assert summary["ranks"] == ranks and summary["identical"] and summary["same_plan"]
    assert summary["counts"]["swap"] > 0 and summary["counts"]["recompute"] > 0
    assert max(summary["measured_peak_bytes"]) <= summary["budget_bytes"]
    if profile_iters == "3":       # the second profiled iteration's update ran an all-reduce
        assert summary["allreduce_s"] > 0 and summary["allreduce_scratch_bytes"] >= 0


def _case(name: str, ranks: int = 2) -> list[dict]:
    run = _mpiexec(ranks, "tests/mpi_cases.py", name)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case, error, words", [
    ("refuse", "BudgetTooSmallError", "below the minimum"),
    ("mismatch-batch", "RanksDisagreeError", "batch sizes (rank 0: 8, rank 1: 12)"),
    ("mismatch-model", "RanksDisagreeError", "models (rank 0: SmallResNet, rank 1: BranchyNet)")])
def test_a_refusal_is_the_same_error_on_every_rank_with_nothing_changed(case, error, words):
    ranks = _case(case)
    assert [r["error"] for r in ranks] == [error, error]
    assert ranks[0]["message"] == ranks[1]["message"] and words in ranks[0]["message"]
    assert all(r["unchanged"] and r["iterations"] == 0 for r in ranks)


def test_a_refusal_on_four_ranks_leaves_nobody_waiting():
    ranks = _case("refuse", 4)
    assert len(ranks) == 4 and {r["error"] for r in ranks} == {"BudgetTooSmallError"}
