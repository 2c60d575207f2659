"""The GPU check's plan of one call (bench/gpu_check.py): each stage and each benchmark inside a share of the
call's time, and PyTorch workloads that stop their steps at a deadline with what they timed (bench/torch_e2e.py).
Clocks and steps are stand-ins here: what is checked is who gets which time, not how long anything takes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import torch_e2e  # noqa: E402


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_item_that_ends_early_leaves_its_time_to_those_after_it() -> None:
    clock = Clock()
    plan = gpu_check.Schedule(100, [40, 30, 30], clock)
    assert plan.limit(0) == 40  # the later items' 60 s are theirs
    clock.now += 10  # the first took 10 of its 40
    assert plan.limit(1) == 60
    clock.now += 60
    assert plan.limit(2) == 30


def test_an_item_that_runs_to_its_limit_takes_nothing_owed_to_the_last() -> None:
    clock = Clock()
    plan = gpu_check.Schedule(100, [20, 20, 20, 40], clock)
    for i in range(3):
        limit = plan.limit(i)
        clock.now += limit  # each runs until it is cut
    assert plan.limit(3) == 40  # the last still has its whole share


def test_shares_shrink_in_proportion_when_the_time_is_short_and_a_cap_holds() -> None:
    clock = Clock()
    plan = gpu_check.Schedule(50, [60, 40], clock)
    assert plan.shares == [30, 20]
    assert plan.limit(0) == 30
    assert plan.limit(0, most=12) == 12
    clock.now += 80  # past the end: nothing is left, not a negative limit
    assert plan.limit(1) == 0


def test_every_bench_item_has_a_share_and_the_stage_fits_its_bound() -> None:
    """Every workload of the GPU's list and the sim's has its own share: none waits for what the others leave."""
    for workloads, column in ((gpu_check.E2E, 0), (gpu_check.SIM_E2E, 1)):
        names = ["foundation", "graphs", "allocators", *workloads]
        assert all(gpu_check.BENCH_SHARES[n][column] > 0 for n in names), names
    assert sum(gpu_check.BENCH_SHARES[n][0] for n in ["foundation", "graphs", "allocators", *gpu_check.E2E]) \
        <= gpu_check.BENCH_MOST <= 360
    assert sum(share for share, _ in gpu_check.STAGE_SHARES.values()) <= gpu_check.CALL_LIMIT


class Steps:
    """A workload's step that moves the clocks (the wall clock and the step timer) `each` seconds."""

    def __init__(self, monkeypatch, each: float) -> None:
        self.now, self.each, self.calls, self.synced = 5000.0, each, 0, 0
        for clock in ("time", "perf_counter"):
            monkeypatch.setattr(torch_e2e.time, clock, lambda: self.now)

    def step(self) -> None:
        self.calls += 1
        self.now += self.each

    def sync(self) -> None:
        self.synced += 1


def test_steps_stop_at_the_deadline_with_what_they_timed(monkeypatch) -> None:
    steps = Steps(monkeypatch, each=2.0)
    times = torch_e2e.time_steps(steps.step, steps.sync, 20, 3, stop_at=steps.now + 9)
    # warm-up 3 steps (6 s), then a timed one (to +8): a second would end past the deadline at +9
    assert len(times) == 1 and steps.calls == 4


def test_a_late_workload_still_times_one_step(monkeypatch) -> None:
    steps = Steps(monkeypatch, each=2.0)
    began = []
    times = torch_e2e.time_steps(steps.step, steps.sync, 20, 3, stop_at=steps.now - 1, begin=lambda: began.append(1))
    assert len(times) == 1 and steps.calls == 2 and began == [1]  # one warm-up step, one timed


def test_without_a_deadline_every_step_runs(monkeypatch) -> None:
    steps = Steps(monkeypatch, each=2.0)
    times = torch_e2e.time_steps(steps.step, steps.sync, 20, 3)
    assert len(times) == 20 and steps.calls == 23 and steps.synced == 21
