"""bench/dask_gpus.py's split of a traced run's wall time (pool busy, a block queued, Python in
a task, Dask between tasks): each moment counted once, in that order."""

import importlib.util
import pathlib

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "dask_gpus.py"


@pytest.fixture(scope="module")
def timeline_parts():
    spec = importlib.util.spec_from_file_location("dask_gpus", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.timeline_parts


def test_each_moment_is_counted_once_in_order(timeline_parts):
    # Two tasks (1-5 and 3-9); the pool busy 2-4 and 6-7, a block queued 1.5-2.5 (under the
    # busy span from 2 on) and 7-8; nothing from 9 to 10.
    parts = timeline_parts(0.0, 10.0, [(1, 5), (3, 9)], [(2, 4), (6, 7)], [(1.5, 2.5), (7, 8)])
    assert parts["pool_busy_s"] == pytest.approx(3.0)
    assert parts["block_queued_s"] == pytest.approx(0.5 + 1.0)
    assert parts["in_tasks_s"] == pytest.approx(0.5 + 2 + 1)  # 1-1.5, 4-6 and 8-9
    assert parts["between_tasks_s"] == pytest.approx(1.0 + 1.0)  # 0-1 and 9-10
    assert parts["before_first_task_s"] == pytest.approx(1.0)
    assert parts["after_last_task_s"] == pytest.approx(1.0)
    assert sum(parts[k] for k in ("pool_busy_s", "block_queued_s", "in_tasks_s",
                                  "between_tasks_s")) == pytest.approx(parts["wall_s"])
    assert parts["tasks"] == 2
    assert parts["tasks_at_once"] == pytest.approx((4 + 6) / 10)


def test_spans_outside_the_run_are_cut_to_it(timeline_parts):
    parts = timeline_parts(2.0, 4.0, [(0, 3)], [(1, 2.5)])
    assert parts["pool_busy_s"] == pytest.approx(0.5)
    assert parts["in_tasks_s"] == pytest.approx(0.5)
    assert parts["between_tasks_s"] == pytest.approx(1.0)
    assert parts["before_first_task_s"] == 0.0
    assert parts["after_last_task_s"] == pytest.approx(1.0)
    assert parts["tasks_at_once"] == pytest.approx(0.5)


def test_a_gap_between_two_tasks_is_neither_before_nor_after(timeline_parts):
    parts = timeline_parts(0.0, 6.0, [(1, 2), (4, 5)], [])
    assert parts["between_tasks_s"] == pytest.approx(4.0)
    assert parts["before_first_task_s"] == pytest.approx(1.0)
    assert parts["after_last_task_s"] == pytest.approx(1.0)
    assert parts["in_tasks_s"] == pytest.approx(2.0)
