"""StepTimer: every second of the training thread lands in exactly one category."""

from __future__ import annotations

import pytest
import torch

from prudent.kernel.loop_times import batch_size
from prudent.profile.timer import CHUNK, StepTimer


def run_steps(timer: StepTimer, t: float, durations: list[tuple[float, float]]) -> float:
    """Steps of (data wait, compute) seconds, back to back, starting at time ``t``."""
    for wait, compute in durations:
        t += wait
        timer.batch_loaded(t, wait, 8)
        t += compute
        timer.step_end(t)
    return t


def test_categories_add_up_to_the_wall_time_from_the_first_batch() -> None:
    timer = StepTimer()
    timer.start(100.0)
    t = run_steps(timer, 102.0, [(0.02, 0.01)] * 10)  # 2 s of setup first
    timer.logged(t + 0.5)  # evaluation after the last step
    timer.checkpoint_taken(t + 0.7)
    timer.finish(t + 0.8)
    assert timer.setup_s == pytest.approx(2.0)
    assert timer.breakdown() == pytest.approx(
        {"data": 0.2, "compute": 0.1, "checkpoint": 0.2, "eval": 0.5, "other": 0.1})
    assert timer.total_s == pytest.approx(t + 0.8 - 102.0)
    counts = (timer.num_steps, timer.num_samples, timer.num_evals, timer.num_checkpoints)
    assert counts == (10, 80, 1, 1)


def test_gap_between_a_step_and_the_next_wait_is_other() -> None:
    timer = StepTimer()
    timer.start(0.0)
    timer.batch_loaded(1.0, 0.5, 4)
    timer.step_end(1.2)
    timer.batch_loaded(1.9, 0.4, 4)  # 0.3 s passed between step_end and the wait: other
    timer.step_end(2.0)
    timer.finish(2.0)
    assert timer.breakdown() == pytest.approx(
        {"data": 0.9, "compute": 0.3, "checkpoint": 0.0, "eval": 0.0, "other": 0.3})


def test_gradient_accumulation_counts_the_micro_batches_compute() -> None:
    timer = StepTimer()
    timer.start(0.0)
    timer.batch_loaded(0.1, 0.1, 4)
    timer.batch_loaded(0.4, 0.1, 4)  # 0.2 s of compute on the first micro-batch
    timer.step_end(0.6)
    timer.finish(0.6)
    assert timer.data_s == pytest.approx(0.2) and timer.compute_s == pytest.approx(0.4)
    assert timer.num_steps == 1 and timer.num_samples == 8


def test_log_inside_a_step_stays_compute() -> None:
    timer = StepTimer()
    timer.start(0.0)
    timer.batch_loaded(0.1, 0.1, 1)
    timer.logged(0.2)  # run.log of training metrics in the middle of a step
    timer.step_end(0.3)
    timer.finish(0.3)
    assert timer.eval_s == 0 and timer.num_evals == 0 and timer.compute_s == pytest.approx(0.2)


def test_loop_without_run_batches_is_all_compute() -> None:
    timer = StepTimer()
    timer.start(0.0)
    for i in range(1, 4):
        timer.step_end(float(i))
    timer.finish(3.0)
    assert timer.compute_s == pytest.approx(3.0) and timer.data_s == 0


def test_outliers_are_found_with_their_steps_after_the_warmup() -> None:
    timer = StepTimer(outlier_factor=3.0, warmup_steps=5)
    timer.start(0.0)
    steps = [(0.0, 0.5)] + [(0.001, 0.009)] * 99  # a slow first step: warm-up, not an outlier
    for stall in (20, 40, 60):
        steps[stall - 1] = (0.001, 0.1)
    run_steps(timer, 0.0, steps)
    timer.finish(10.0)
    assert [o.step for o in timer.outliers] == [20, 40, 60]
    assert timer.num_outliers == 3 and timer.outlier_excess_s == pytest.approx(3 * 0.091)
    assert timer.step_time() == pytest.approx({"median_s": 0.01, "p90_s": 0.01, "num_steps": 95})


def test_outliers_keep_their_step_numbers_across_chunks_and_resumes() -> None:
    timer = StepTimer(warmup_steps=0)
    timer.start(0.0)
    timer.step_end(0.01)
    timer.number_steps_from(1000)  # a resumed run: its first step here is step 1001
    durations = [0.01] * (2 * CHUNK + 10)
    durations[CHUNK + 100] = 1.0
    t = 0.01
    for d in durations:
        t += d
        timer.step_end(t)
    timer.finish(t)
    assert [o.step for o in timer.outliers] == [1001 + 1 + CHUNK + 100]


def test_steps_under_the_profiler_are_not_outliers() -> None:
    timer = StepTimer(warmup_steps=0)
    timer.start(0.0)
    t = run_steps(timer, 0.0, [(0.0, 0.01)] * 20)
    timer.excluding = True
    t = run_steps(timer, t, [(0.0, 0.2)] * 5)
    timer.excluding = False
    run_steps(timer, t, [(0.0, 0.01)] * 20)
    timer.finish(t)
    assert timer.num_outliers == 0 and timer.num_steps == 45


def test_a_step_that_waited_for_the_device_can_be_left_out_of_the_outlier_search() -> None:
    timer = StepTimer(warmup_steps=0)
    timer.start(0.0)
    t = 0.0
    for step in range(1, 41):
        t += 0.5 if step % 10 == 0 else 0.01  # a device sync every 10 steps drains a queue
        timer.step_end(t, exclude=step % 10 == 0)
    timer.finish(t)
    assert timer.num_outliers == 0 and timer.compute_s == pytest.approx(t)


@pytest.mark.parametrize(("batch", "size"), [
    ((torch.zeros(32, 3), torch.zeros(32)), 32),
    ({"input_ids": torch.zeros(4, 128), "labels": torch.zeros(4, 128)}, 4),
    (torch.zeros(7), 7),
    (torch.tensor(3.0), 1),
    (["a sentence", "another"], 2),
    (5, 1),
])
def test_batch_size_is_inferred_from_the_first_tensor(batch: object, size: int) -> None:
    assert batch_size(batch) == size


def test_the_kernels_stamps_replayed_in_bulk_time_the_steps_as_calls_would() -> None:
    """StepTimer.replay (the profiler asleep, the kernel's LoopTimes taken every few hundred
    steps) ends where a call per batch and per step ends: the split, the step count, the
    outliers with their steps; on plain steps, on gradient accumulation, on a batch whose
    step has not ended when the stamps are taken, with evaluations in between."""
    import random

    rng = random.Random(0)
    direct, bulk = StepTimer(warmup_steps=2), StepTimer(warmup_steps=2)
    for timer in (direct, bulk):
        timer.start(0.0)
    loaded: list[float] = []
    ended: list[float] = []
    t = 1.0
    for step in range(3 * CHUNK):
        micro = 2 if 1000 <= step < 1100 else 1  # a stretch of gradient accumulation
        for _ in range(micro):
            wait = rng.uniform(0.001, 0.003) * (20 if step % 500 == 250 else 1)  # outliers
            t += rng.uniform(0, 1e-4) + wait
            direct.batch_loaded(t, wait, 0)
            loaded += (t, wait)
            t += rng.uniform(0.005, 0.006)
        direct.step_end(t)
        ended.append(t)
        if rng.random() < 0.01 or step % 300 == 299:
            if rng.random() < 0.3:  # stamps taken mid-step (run.log inside a step)
                t += 0.001
                direct.batch_loaded(t, 0.0005, 0)
                loaded += (t, 0.0005)
                bulk.replay(loaded, ended)
                loaded, ended = [], []
                t += 0.004
                direct.step_end(t)
                ended.append(t)
            bulk.replay(loaded, ended)
            loaded, ended = [], []
            t += 0.01
            for timer in (direct, bulk):
                timer.logged(t)  # an evaluation after the step
    bulk.replay(loaded, ended)
    for timer in (direct, bulk):
        timer.finish(t + 0.01)
    assert bulk.breakdown() == pytest.approx(direct.breakdown(), rel=1e-9)
    assert (bulk.num_steps, bulk.num_evals) == (direct.num_steps, direct.num_evals)
    assert [o.step for o in bulk.outliers] == [o.step for o in direct.outliers]
    assert len(direct.outliers) >= 5
    assert bulk.step_time() == pytest.approx(direct.step_time(), rel=1e-9)
