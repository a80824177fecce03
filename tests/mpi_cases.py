"""Run under mpiexec by tests/test_mpi.py: PoocH(comm=...) cases whose outcome every rank
reports; rank 0 prints them as one JSON line.

    mpiexec -n 2 python tests/mpi_cases.py refuse|mismatch-batch|mismatch-model
"""
from __future__ import annotations

import json
import sys

import numpy as np

import pooch_ext  # noqa: F401
import chainermn

from pooch_ext.hooks.cpu_device import CpuDevice
from pooch_ext.measure import setup_model
from pooch_ext.testing import model_state, states_equal, synthetic_batches, train


def main(case: str) -> int:
    comm = chainermn.create_communicator("naive")
    batch, model_name, budget = 8, "small-resnet", None
    if case == "refuse":
        budget = 1 << 10                     # far below any plan: refused on every rank
    elif case == "mismatch-batch":
        batch = 8 + 4 * comm.rank            # the ranks disagree on the batch size
    elif case == "mismatch-model":
        model_name = "small-resnet" if comm.rank == 0 else "branchy"
    model, optimizer = setup_model(model_name, gpu=False) if model_name != "branchy" \
        else _branchy()
    optimizer = chainermn.create_multi_node_optimizer(optimizer, comm)
    before = model_state(model, optimizer)
    batches = synthetic_batches(4, batch, (3, 32, 32), 10, seed=1 + comm.rank)
    result = train(model, optimizer, batches,
                   dict(profile_iters=2, budget=budget, device=CpuDevice(link="cpu"),
                        verbose=False, comm=comm))
    error = result.error
    mine = dict(error=type(error).__name__ if error else None,
                message=str(error) if error else None, iterations=len(result.losses),
                unchanged=states_equal(before, model_state(model, optimizer)))
    ranks = comm.gather_obj(mine)
    if comm.rank == 0:
        print(json.dumps(ranks))
    return 0


def _branchy():
    from pooch_ext.testing import BranchyNet, make_optimizer

    np.random.seed(0)
    model = BranchyNet(n_classes=10)
    return model, make_optimizer(model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
