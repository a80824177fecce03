"""hooks/arena.py: an iteration's blocks at offsets planned from the two before it, never over
a live block; the CuPy glue with a stand-in for CuPy's allocator API."""
from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from pooch_ext.hooks.arena import ArenaPlan, CupyArena
from pooch_ext.cupy_pool import round_size
from pooch_ext.placement import Block, peak_held

# an iteration: a big block freed before a small one comes, then another big one (CuPy's
# pool would split the first big chunk for the small one and need a second big one)
SCRIPT = [("m", "x", 4096), ("m", "col", 8192), ("f", "col"), ("m", "y", 512),
          ("m", "col2", 8192), ("f", "x"), ("f", "col2"), ("f", "y")]


def iterate(plan: ArenaPlan, script: list, keep: set = frozenset(), held: dict | None = None
            ) -> dict:
    """Run ``script`` through ``plan``: name -> offset or None; ``keep`` are never released
    (a user holding arrays), their tokens left in ``held``."""
    tokens, offsets = {}, {}
    for step in script:
        if step[0] == "m":
            tokens[step[1]], offsets[step[1]] = plan.request(step[2])
        elif step[1] not in keep:
            plan.released(tokens[step[1]])
    if held is not None:
        held.update({name: tokens[name] for name in keep})
    plan.new_iteration()
    return offsets


def _check_no_overlap(script: list, offsets: dict) -> None:
    live: dict = {}
    sizes = {s[1]: round_size(s[2]) for s in script if s[0] == "m"}
    for step in script:
        name = step[1]
        if step[0] == "f":
            live.pop(name, None)
            continue
        if offsets[name] is None:
            continue
        low, high = offsets[name], offsets[name] + sizes[name]
        assert all(not (a < high and low < b) for a, b in live.values()), name
        live[name] = (low, high)


def test_two_alike_iterations_plan_the_third_in_the_bytes_held():
    plan = ArenaPlan()
    assert iterate(plan, SCRIPT) == dict.fromkeys(["x", "col", "y", "col2"])
    assert not plan.serving
    iterate(plan, SCRIPT)
    assert plan.serving
    offsets = iterate(plan, SCRIPT)
    assert None not in offsets.values()
    _check_no_overlap(SCRIPT, offsets)
    events = [Block(4096, 0, 6), Block(8192, 1, 3), Block(512, 4, 8), Block(8192, 5, 7)]
    assert plan.extent == peak_held(events) == 4096 + 512 + 8192
    assert iterate(plan, SCRIPT) == offsets              # and on, as planned


def test_a_request_unlike_the_plan_goes_to_the_pool_and_the_plan_is_kept():
    plan = ArenaPlan()
    iterate(plan, SCRIPT)
    iterate(plan, SCRIPT)
    other = [("m", "x", 4096), ("m", "z", 1024), ("f", "z"), ("m", "y", 512), ("f", "x"),
             ("f", "y")]
    offsets = iterate(plan, other)
    assert offsets["z"] is None              # not the plan's size at its place
    assert offsets["x"] is not None and offsets["y"] is not None     # the plan's, places free
    _check_no_overlap(other, offsets)
    served = iterate(plan, SCRIPT)           # the plan is kept for iterations like it
    assert None not in served.values()
    iterate(plan, other)
    iterate(plan, other)                     # a new sequence asked twice in a row: planned
    assert None not in iterate(plan, other).values()
    _check_no_overlap(other, iterate(plan, other))


def test_a_block_still_held_where_the_plan_puts_another_sends_that_one_to_the_pool():
    """A user kept an array: its place is never handed out while it lives."""
    plan = ArenaPlan()
    iterate(plan, SCRIPT)
    iterate(plan, SCRIPT)
    held: dict = {}
    first = iterate(plan, SCRIPT, keep={"x"}, held=held)     # x outlives the iteration
    assert first["x"] is not None
    second = iterate(plan, SCRIPT)
    assert second["x"] is None                       # x's place is x's until it is freed
    plan.released(held["x"])
    gc.collect()
    # a fresh plan is learnt from iterations without x held, then serves again
    iterate(plan, SCRIPT)
    assert plan.serving and None not in iterate(plan, SCRIPT).values()


def test_a_block_that_outlives_every_iteration_is_left_to_the_pool_without_stopping_it():
    script = SCRIPT + [("m", "loss", 512)]            # kept by the loop into the next one
    plan = ArenaPlan()
    held: dict = {}
    for _ in range(2):
        iterate(plan, script, keep={"loss"}, held=held)
    offsets = iterate(plan, script, keep={"loss"}, held=held)
    assert offsets["loss"] is None
    assert all(offsets[name] is not None for name in ("x", "col", "y", "col2"))
    assert plan.serving


# ------------------------------------------------------------------ the CuPy glue

class _FakeCuda:
    """get/set_allocator, UnownedMemory, MemoryPointer and a pool handing out addresses."""

    def __init__(self) -> None:
        self.allocator = "default"
        self.next_ptr = 1 << 20
        self.pool_blocks: list = []
        fake = self

        self.limit = None

        class Pool:
            def malloc(self, nbytes):
                if fake.limit is not None and nbytes > fake.limit:
                    raise MemoryError("Out of memory allocating")
                ptr, fake.next_ptr = fake.next_ptr, fake.next_ptr + round_size(nbytes) + 4096
                block = SimpleNamespace(ptr=ptr, device_id=0, mem=SimpleNamespace(size=nbytes))
                fake.pool_blocks.append(block)
                return block
        self.pool = Pool()
        self.cuda = SimpleNamespace(
            get_allocator=lambda: self.allocator,
            set_allocator=lambda f: setattr(self, "allocator", f),
            UnownedMemory=lambda ptr, size, owner, device_id: SimpleNamespace(
                ptr=ptr, size=size, owner=owner),
            MemoryPointer=lambda mem, offset: SimpleNamespace(mem=mem, ptr=mem.ptr + offset),
            get_current_stream=lambda: SimpleNamespace(ptr=self.stream))
        self.stream = 0
        self.get_default_memory_pool = lambda: self.pool


def run_script(arena: CupyArena, malloc=None) -> dict:
    """One iteration of SCRIPT through ``malloc`` (default the arena's): name -> pointer."""
    malloc = malloc or arena.malloc
    arrays, ptrs = {}, {}
    for step in SCRIPT:
        if step[0] == "m":
            arrays[step[1]] = malloc(step[2])
            ptrs[step[1]] = arrays[step[1]].ptr
        else:
            del arrays[step[1]]              # no cycles: CPython lets go at once
    arena.new_iteration()
    return ptrs


def test_cupy_arena_serves_views_of_one_pool_block_and_gives_the_allocator_back():
    fake = _FakeCuda()
    arena = CupyArena(fake)
    arena.install()
    assert fake.allocator == arena.malloc

    run_script(arena, fake.allocator)
    run_script(arena, fake.allocator)
    blocks_before = len(fake.pool_blocks)
    ptrs = run_script(arena, fake.allocator)
    assert len(fake.pool_blocks) == blocks_before + 1 and arena.served == 4   # the arena's
    base = arena.block.ptr
    assert all(base <= p < base + arena.plan.extent for p in ptrs.values())
    arena.uninstall()
    assert fake.allocator == "default"


@pytest.mark.parametrize("size", [1, 513])
def test_cupy_arena_hands_out_what_was_asked(size):
    fake = _FakeCuda()
    arena = CupyArena(fake)
    pointer = arena.malloc(size)
    assert pointer.mem.size == size and arena.fallbacks == 1


def test_while_a_profiler_reads_the_pool_the_arena_neither_learns_serves_nor_holds():
    """A profiled iteration's memory is read from the pool's hooks, which an arena view
    bypasses, and an idle arena block would count in it."""
    fake = _FakeCuda()
    profiling = [False]
    arena = CupyArena(fake, profiling=lambda: profiling[0])
    for _ in range(3):
        run_script(arena)
    assert arena.served == 4 and arena.block is not None
    profiling[0] = True                      # a graph changed: PoocH profiles again
    run_script(arena)
    assert arena.served == 4 and arena.block is None
    profiling[0] = False
    run_script(arena)                        # the plan was kept: served again at once
    assert arena.served == 8


def test_work_set_aside_is_the_pools_and_not_part_of_the_sequence():
    """Plain Chainer beside PoocH (train_side_by_side) runs aside: the windows between
    PoocH's iterations would otherwise alternate and never be alike."""
    fake = _FakeCuda()
    arena = CupyArena(fake)
    for k in range(3):
        if k % 2:
            with arena.aside():
                beside = [arena.malloc(100), arena.malloc(7000)]
            del beside
        run_script(arena)
    assert arena.served == 4 and arena.fallbacks == 8


def test_an_arena_the_pool_cannot_give_serves_nothing_and_training_goes_on():
    fake = _FakeCuda()
    fake.limit = 8192                  # less than the plan's extent (4096 + 512 + 8192)
    arena = CupyArena(fake)
    for _ in range(3):
        run_script(arena)
    assert arena.block is None and arena.served == 0 and arena.fallbacks == 12



def test_a_place_still_held_keeps_the_plan_and_alternating_loops_never_re_plan(monkeypatch):
    """Planning is quadratic in the blocks: a loop that holds a block into every other
    iteration must not re-plan every other iteration; it loses the arena for the rest of
    the iterations that find a place held, and keeps the plan."""
    from pooch_ext.hooks import arena

    plans = []
    real = arena.plan_offsets
    monkeypatch.setattr(arena, "plan_offsets", lambda blocks: plans.append(1) or real(blocks))
    plan = ArenaPlan()
    iterate(plan, SCRIPT)
    iterate(plan, SCRIPT)
    assert len(plans) == 1
    held: dict = {}
    for k in range(6):
        keep = {"y"} if k % 2 == 0 else frozenset()
        offsets = iterate(plan, SCRIPT, keep=keep, held=held)
        if k % 2:
            assert offsets["x"] is not None and offsets["y"] is None   # y's place still held
            plan.released(held.pop("y"))
    assert len(plans) == 1 and plan.serving


def test_the_arena_serves_only_on_the_stream_it_was_made_on():
    """CuPy's pool keeps each stream's free blocks apart; the arena is one stream's."""
    fake = _FakeCuda()
    arena = CupyArena(fake)
    for _ in range(3):
        run_script(arena)
    assert arena.served == 4                 # its block made on stream 0
    fake.stream = 7
    run_script(arena)
    assert arena.served == 4
    fake.stream = 0
    run_script(arena)
    assert arena.served == 8
