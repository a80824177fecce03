"""Rank agreement (pooch_ext/distributed.py) without MPI: profiles combined and checked, rank
0's decision or error handed to every rank. tests/test_mpi.py runs it for real."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pooch_ext.distributed import Ranks, check_same_iteration, combine_profiles
from pooch_ext.errors import BudgetTooSmallError, RanksDisagreeError
from pooch_ext.measure import measured_profile


@pytest.fixture(scope="module")
def profiles():
    """Two measured profiles of the same network and batch (two 'ranks'), and one at another
    batch size."""
    first = measured_profile("small-resnet", 4, iters=2, link="cpu")
    second = measured_profile("small-resnet", 4, iters=2, link="cpu")
    other = measured_profile("small-resnet", 2, iters=2, link="cpu")
    return first, second, other


class FakeComm:
    """Rank 0 of a communicator whose other ranks sent ``others`` (gather) and which keeps
    what rank 0 broadcasts."""

    def __init__(self, others: list, rank: int = 0) -> None:
        self.rank, self.size, self.others, self.sent = rank, 1 + len(others), others, []

    def multi_node_mean_grad(self, model, zero_fill=False):
        return None

    def gather_obj(self, obj, root=0):
        return [obj, *self.others]

    def bcast_obj(self, obj, root=0):
        self.sent.append(obj)
        return obj


def test_the_combined_profile_takes_the_slowest_rank_and_stays_consistent(profiles):
    first, second, _ = profiles
    combined = combine_profiles([first, second])
    combined.check()                       # the profile contract holds (recompute_s too)
    assert np.array_equal(combined.ops.duration_s,
                          np.maximum(first.ops.duration_s, second.ops.duration_s))
    assert np.array_equal(combined.tensors.swap_in_s,
                          np.maximum(first.tensors.swap_in_s, second.tensors.swap_in_s))
    assert combined.incore_time_s >= max(first.incore_time_s, second.incore_time_s) - 1e-12
    assert combined.meta["ranks"] == 2


def test_ranks_with_other_batches_graphs_or_settings_are_told_apart(profiles):
    first, second, other = profiles
    settings = dict(budget=1 << 20, policy="pooch")
    check_same_iteration([first, second], [settings, settings])
    with pytest.raises(RanksDisagreeError, match=r"batch sizes \(rank 0: 4, rank 1: 2\)"):
        check_same_iteration([first, other], [settings, settings])
    with pytest.raises(RanksDisagreeError, match="PoocH settings"):
        check_same_iteration([first, second], [settings, dict(settings, budget=1)])
    fewer = dataclasses.replace(second, meta=dict(second.meta))
    fewer.ops = second.ops.iloc[:-1]
    with pytest.raises(RanksDisagreeError, match="rank 1's training iteration differs"):
        check_same_iteration([first, fewer], [settings, settings])
    tensors = second.tensors.copy()
    tensors.at[0, "shape"] = (9, 9)
    wider = dataclasses.replace(second, meta=dict(second.meta))
    wider.tensors = tensors                 # another rank's input shape (not re-validated)
    with pytest.raises(RanksDisagreeError, match=r"tensors row 0, shape: \(9, 9\) against"):
        check_same_iteration([first, wider], [settings, settings])


def test_rank_zero_decides_on_the_combined_profile_and_its_error_reaches_every_rank(profiles):
    first, second, _ = profiles
    settings = dict(budget=1)
    comm = FakeComm([(second, settings)])
    seen = []
    combined, value = Ranks(comm).agree(first, lambda p: seen.append(p) or "plan", settings)
    assert value == "plan" and seen == [combined] and combined.meta["ranks"] == 2

    def refuse(profile):
        raise BudgetTooSmallError(1, 2, "net")
    comm = FakeComm([(second, settings)])
    with pytest.raises(BudgetTooSmallError) as caught:
        Ranks(comm).agree(first, refuse, settings)
    assert caught.value.minimum_bytes == 2 and "net" in str(caught.value)
    assert comm.sent[0][0] == "error"      # what the other ranks receive and raise


def test_other_ranks_take_rank_zeros_outcome_without_deciding(profiles):
    first, _, _ = profiles

    class Follower(FakeComm):
        def bcast_obj(self, obj, root=0):
            assert obj is None             # a rank other than 0 sends nothing
            return ("value", first, "rank 0's plan")
    called = []
    combined, value = Ranks(Follower([], rank=1)).agree(first, called.append, {})
    assert value == "rank 0's plan" and combined is first and not called


def test_ranks_refuse_on_the_most_any_rank_held():
    """The end of the first updating iteration refuses on what ran after its last op: every
    rank on the largest any rank held (rank 0 decides and broadcasts), so none goes on
    alone into a collective the others left."""
    comm = FakeComm([700, 300])
    assert Ranks(comm).most(500) == 700 and comm.sent == [700]

    class Follower(FakeComm):
        def bcast_obj(self, obj, root=0):
            assert obj is None             # a rank other than 0 sends nothing
            return 900
    assert Ranks(Follower([], rank=1)).most(100) == 900


def test_the_all_reduce_meter_times_the_call_and_counts_its_scratch():
    from pooch_ext.distributed import AllreduceMeter
    from pooch_ext.hooks.cpu_device import CpuDevice

    class Comm:
        def multi_node_mean_grad(self, model, zero_fill=False):
            scratch = np.ones(1 << 18, np.float32)          # 1 MiB, freed on return
            return float(scratch.sum())
    device = CpuDevice()
    try:
        comm = Comm()
        meter = AllreduceMeter(comm, device.counter)
        assert meter.after_backward() is None               # nothing measured yet
        meter.install()
        device.counter.use(True)
        assert comm.multi_node_mean_grad(None) == float(1 << 18)
        meter.remove()
        seconds, scratch = meter.after_backward()
        assert seconds > 0 and scratch >= 1 << 20
        assert "multi_node_mean_grad" not in vars(comm)      # the class's method again
    finally:
        device.restore()


def test_work_after_backward_is_charged_to_the_last_backward_op():
    """Every plan pays the all-reduce's time, and holds its scratch where backward ends."""
    from pooch_ext.distributed import AllreduceMeter
    from pooch_ext.hooks.cpu_device import CpuDevice
    from pooch_ext.testing import BranchyNet, make_optimizer, synthetic_batches, train

    np.random.seed(0)
    model = BranchyNet()
    result = train(model, make_optimizer(model), synthetic_batches(2, 4, (3, 16, 16), 5),
                   dict(profile_iters=2, policy=None, device=CpuDevice(), verbose=False))
    pooch = result.pooch
    samples = pooch.profiler.samples
    plain = pooch._build_profile(samples)
    pooch._allreduce = AllreduceMeter(None)
    pooch._allreduce.seconds, pooch._allreduce.scratch = [0.25], [1 << 30]
    charged = pooch._build_profile(samples)
    last = plain.ops.index[-1]
    assert charged.ops.duration_s[last] == pytest.approx(plain.ops.duration_s[last] + 0.25)
    assert charged.ops.transient_bytes[last] >= 1 << 30
    assert charged.incore_time_s == pytest.approx(plain.incore_time_s + 0.25)
    assert charged.incore_peak_bytes >= (1 << 30) > plain.incore_peak_bytes
    assert charged.meta["after_backward"] == dict(seconds=0.25, scratch_bytes=1 << 30)


def test_a_communicator_that_is_not_chainermns_is_refused_with_what_it_lacks():
    from pooch_ext.errors import PoochError
    from pooch_ext.pooch import PoocH
    from pooch_ext.testing import BranchyNet

    class MpiLike:                           # mpi4py's COMM_WORLD has rank and size only
        rank, size = 0, 1
    with pytest.raises(PoochError, match="ChainerMN communicator.*gather_obj"):
        PoocH(BranchyNet(), comm=MpiLike())


def test_each_ops_scratch_is_the_largest_any_rank_measured_even_where_one_measured_none(
        profiles):
    """The event lists differ where one rank measured scratch at an op and another none: the
    combined profile must charge the larger at every op (a rank overran its budget by 0.4 MB
    at a backward ReLU when only one rank's events were taken)."""
    first, second, _ = profiles
    ops = second.ops.copy()
    quiet = int(np.flatnonzero(first.ops.transient_bytes.to_numpy() == 0)[0])
    ops.loc[quiet, "transient_bytes"] = 12345          # scratch only this rank saw
    louder = dataclasses.replace(second, ops=ops)
    combined = combine_profiles([first, louder])
    transient = combined.memory[combined.memory.category == "transient"]
    charged = transient[transient.kind == "malloc"].groupby("op").bytes.sum()
    expected = np.maximum(first.ops.transient_bytes.to_numpy(), ops.transient_bytes.to_numpy())
    assert [int(charged.get(k, 0)) for k in range(len(expected))] == expected.tolist()
    assert charged[quiet] == 12345
    assert (combined.memory.seq.to_numpy() == np.arange(len(combined.memory))).all()
