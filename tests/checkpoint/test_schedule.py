from __future__ import annotations

import pytest

from prudent.checkpoint.schedule import SaveSchedule, daly_interval_s
from prudent.testing import FakeClock


@pytest.mark.parametrize(("cost_s", "mtbi_s", "minutes"), [(60, 6 * 3600, 26.2), (6, 6 * 3600, 8.4),
                                                           (60, 3600, 10.3), (300, 3600, 21.3)])
def test_daly_interval_matches_published_worked_examples(cost_s: float, mtbi_s: float,
                                                         minutes: float) -> None:
    assert daly_interval_s(cost_s, mtbi_s) / 60 == pytest.approx(minutes, abs=0.1)


def test_daly_interval_is_mtbi_when_saving_costs_more_than_twice_it() -> None:
    assert daly_interval_s(100, 40) == 40


def test_step_interval() -> None:
    schedule = SaveSchedule("3steps", at_epoch_end=False, mtbi="6h")
    assert [s for s in range(1, 10) if schedule.due_at_step(s) and (schedule.saved(s) or True)] == [3, 6, 9]


def test_time_interval_uses_the_clock() -> None:
    clock = FakeClock()
    schedule = SaveSchedule("10min", at_epoch_end=True, mtbi="6h", clock=clock)
    assert not schedule.due_at_step(1)
    clock.advance(601)
    assert schedule.due_at_step(2) and schedule.due_at_epoch_end(0)


def test_auto_saves_first_then_explains_the_chosen_interval() -> None:
    clock = FakeClock()
    schedule = SaveSchedule("auto", at_epoch_end=True, mtbi="6h", clock=clock)
    assert schedule.due_at_step(1)
    schedule.saved(1)
    why = schedule.measured(stall_s=6.0, write_s=1.0)
    assert schedule.interval_s == pytest.approx(8.4 * 60, rel=0.01)
    assert why is not None and "Daly interval 50" in why and "6000.0 ms" in why and "6 h" in why
    assert schedule.measured(stall_s=6.1, write_s=1.0) is None  # a small change is not news
    clock.advance(8.3 * 60)
    assert not schedule.due_at_step(2)
    clock.advance(10)
    assert schedule.due_at_step(3)


def test_auto_never_saves_more_often_than_a_write_takes() -> None:
    schedule = SaveSchedule("auto", at_epoch_end=False, mtbi="6h")
    schedule.measured(stall_s=0.0001, write_s=30.0)
    assert schedule.interval_s == 60.0


def test_epoch_interval() -> None:
    schedule = SaveSchedule("2epochs", at_epoch_end=False, mtbi="6h")
    assert [e for e in range(6) if schedule.due_at_epoch_end(e)] == [1, 3, 5]
    assert not schedule.due_at_step(100)


def test_auto_takes_one_measuring_save_then_waits_for_its_result() -> None:
    schedule = SaveSchedule("auto", at_epoch_end=False, mtbi="6h")
    assert schedule.due_at_step(1)
    schedule.saved(1)
    assert not any(schedule.due_at_step(s) for s in range(2, 100))  # the write is in flight


def test_auto_saves_at_an_epoch_end_only_where_it_costs_at_most_a_percent() -> None:
    """Epochs of a tenth of a second: a save at each cost more than the steps (4 saves in a
    150-step Lightning round); under auto an epoch-end save waits for 100 x its measured cost."""
    clock = FakeClock()
    schedule = SaveSchedule("auto", at_epoch_end=True, mtbi="6h", clock=clock)
    assert schedule.due_at_epoch_end(0)  # nothing measured yet: the epoch end saves
    schedule.saved(45)
    schedule.measured(stall_s=0.003, write_s=0.01)  # 3 ms a save: at most one per 0.3 s
    clock.advance(0.09)
    assert not schedule.due_at_epoch_end(1)
    clock.advance(0.25)
    assert schedule.due_at_epoch_end(2)
    assert SaveSchedule("10min", at_epoch_end=True, mtbi="6h").due_at_epoch_end(0)  # as asked
