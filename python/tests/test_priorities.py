"""Priorities from Python: submit(..., priority=) and map(..., priority=), the Executor's default,
ties, cancellation and shutdown with mixed priorities, starvation under a steady stream of urgent
calls, the trace, and bad values refused naming the range. One lane, held by a first call, so
that what is submitted next stays queued and the order it runs in is the queue's."""

import concurrent.futures
import threading
import time

import gpupool
import numpy as np
import pytest

AGING = 8  # gpupool::limits::priority_aging_takes


@pytest.fixture
def one_lane():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1, quiet=True) as ex:
        yield ex


def test_submit_runs_the_highest_priority_first(one_lane, hold_every_lane):
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []
    # priority None: the executor's default, 0
    plan = [(0, None), (1, -1), (2, 2), (3, 2), (4, 1), (5, 0)]
    futures = [ex.submit(ran.append, i, priority=p) for i, p in plan]
    release.set()
    concurrent.futures.wait(futures + holders, timeout=30)
    assert ran == [2, 3, 4, 0, 5, 1]


def test_ties_are_first_come_first_served(one_lane, hold_every_lane):
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []
    futures = [ex.submit(ran.append, i, priority=1 if i % 2 else 0) for i in range(10)]
    release.set()
    concurrent.futures.wait(futures, timeout=30)
    assert ran == [1, 3, 5, 7, 9, 0, 2, 4, 6, 8]


def test_the_executors_default_priority_applies_to_calls_without_one(hold_every_lane):
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1, quiet=True,
                          priority=-2) as ex:
        assert ex.priority == -2
        holders, release = hold_every_lane(ex)
        ran = []
        a = ex.submit(ran.append, "default")
        b = ex.submit(ran.append, "higher", priority=-1)
        c = ex.submit_to(0, ran.append, "lowest", priority=-3)
        release.set()
        concurrent.futures.wait([a, b, c], timeout=30)
        assert ran == ["higher", "default", "lowest"]


def test_a_map_of_python_calls_goes_before_queued_work_of_lower_priority(one_lane,
                                                                          hold_every_lane):
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []
    plain = [ex.submit(ran.append, f"plain{i}") for i in range(3)]
    results = ex.map(lambda i: ran.append(f"map{i}") or i, range(4), priority=2)
    release.set()
    assert list(results) == [0, 1, 2, 3]
    concurrent.futures.wait(plain, timeout=30)
    assert ran == ["map0", "map1", "map2", "map3", "plain0", "plain1", "plain2"]


def test_a_kernel_map_carries_its_priority_into_the_trace(one_lane, hold_every_lane):
    ex = one_lane
    data = [np.full(1000, float(i)) for i in range(5)]
    with ex.trace() as t:
        holders, release = hold_every_lane(ex)
        plain = [ex.submit(sum, [i]) for i in range(2)]
        squares = ex.map(gpupool.kernels.square, data, priority=3)
        single = ex.submit(gpupool.kernels.square, data[0], priority=-1)
        release.set()
        out = list(squares)
        assert [p.result() for p in plain] == [0, 1]
        assert np.array_equal(single.result(), data[0] ** 2)
    assert all(np.array_equal(o, d * d) for o, d in zip(out, data))
    records = t.records()
    by_name = {}
    for r in records:
        by_name.setdefault(r["name"], set()).add(r["priority"])
    # The held call, the plain calls: 0; the map's pieces: 3; the single kernel call: -1.
    assert by_name["square"] == {3, -1}
    assert by_name["task"] == {0}
    urgent = [r for r in records if r["priority"] == 3]
    later = [r for r in records if r["name"] == "task" and r["started"] > min(
        u["started"] for u in urgent)]
    assert urgent and len(later) == 2  # the plain calls, queued first, ran after the map began


def test_cancelled_calls_of_mixed_priorities_leave_the_rest_in_order(one_lane,
                                                                      hold_every_lane):
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []
    futures = [ex.submit(ran.append, i, priority=i % 4 - 1) for i in range(8)]
    # priorities: 0:-1 1:0 2:1 3:2 4:-1 5:0 6:1 7:2
    assert futures[3].cancel()
    assert futures[6].cancel()
    release.set()
    concurrent.futures.wait(futures, timeout=30)
    assert futures[3].cancelled() and futures[6].cancelled()
    assert ran == [7, 2, 1, 5, 0, 4]


def test_shutdown_cancelling_pending_calls_of_mixed_priorities_ends_every_future(hold_every_lane):
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1, quiet=True)
    holders, release = hold_every_lane(ex)
    ran = []
    futures = [ex.submit(ran.append, i, priority=i % 7 - 3) for i in range(14)]
    data = [np.ones(256) for _ in range(3)]
    kernels = [ex.submit(gpupool.kernels.square, d, priority=3) for d in data]
    ex.shutdown(wait=False, cancel_futures=True)
    # The held lane keeps the shutdown from ending; it has drained the queue once nothing is
    # queued (and stopped lanes from going on to further calls before that).
    deadline = time.monotonic() + 30
    while ex._core.queued and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    concurrent.futures.wait(futures + kernels + holders, timeout=30)
    assert all(f.cancelled() for f in futures + kernels)
    assert ran == []
    assert all(h.result() is None for h in holders)


def test_shutdown_without_cancelling_runs_everything_in_priority_order(hold_every_lane):
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1, quiet=True)
    holders, release = hold_every_lane(ex)
    ran = []
    futures = [ex.submit(ran.append, i, priority=i % 3) for i in range(6)]
    stopper = threading.Thread(target=ex.shutdown)
    stopper.start()
    # The shutdown has begun (new work is refused) while the calls are still queued.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ex.submit(abs, 1).cancel()
        except RuntimeError:
            break
        time.sleep(0.001)
    assert not any(f.done() for f in futures)
    release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert all(f.done() and not f.cancelled() for f in futures)
    assert ran == [2, 5, 1, 4, 0, 3]


def test_low_priority_runs_under_a_steady_stream_of_urgent_calls(one_lane, hold_every_lane):
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []
    chained = []

    def urgent(left):
        ran.append("urgent")
        if left:
            chained.append(ex.submit(urgent, left - 1, priority=3))

    low = ex.submit(ran.append, "low", priority=-3)
    # Two chains: each urgent call queues the next, so urgent calls are always waiting.
    chained.append(ex.submit(urgent, 50, priority=3))
    chained.append(ex.submit(urgent, 50, priority=3))
    release.set()
    low.result(timeout=30)
    while len(chained) < 102 or not all(f.done() for f in chained):
        concurrent.futures.wait(list(chained), timeout=30)
    assert len(ran) == 103
    # Without aging it would run last; with it, once AGING urgent calls passed it.
    assert ran.index("low") == AGING


def test_a_lane_running_python_calls_yields_to_urgent_kernel_work(one_lane, hold_every_lane):
    # A lane runs queued Python calls one after another while it holds the GIL; an urgent
    # kernel task queued meanwhile is taken after the call running now, not after the calls
    # queued behind it.
    ex = one_lane
    holders, release = hold_every_lane(ex)
    ran = []

    def slow(i):
        time.sleep(0.05)
        ran.append(i)

    calls = [ex.submit(slow, i) for i in range(10)]
    x = np.arange(1024, dtype=np.float64)
    urgent = ex.submit(gpupool.kernels.square, x, priority=3)
    release.set()
    np.testing.assert_array_equal(urgent.result(timeout=30), x * x)
    ran_before = len(ran)
    concurrent.futures.wait(calls, timeout=30)
    assert ran == list(range(10))
    # Without yielding, all ten calls (0.5 s) ran first.
    assert ran_before <= 3, ran_before


@pytest.mark.parametrize("bad, error", [(4, ValueError), (-4, ValueError), (True, TypeError),
                                        (1.5, TypeError), ("1", TypeError)])
def test_priorities_outside_the_range_are_refused_naming_it(one_lane, bad, error):
    ex = one_lane
    with pytest.raises(error, match=r"from -3 to 3"):
        ex.submit(print, priority=bad)
    with pytest.raises(error, match=r"from -3 to 3"):
        ex.submit_to(0, print, priority=bad)
    with pytest.raises(error, match=r"from -3 to 3"):
        ex.map(abs, [1, 2], priority=bad)
    with pytest.raises(error, match=r"from -3 to 3"):
        ex.map(gpupool.kernels.square, [np.ones(4)], priority=bad)
    with pytest.raises(error, match=r"from -3 to 3"):
        gpupool.Executor(threads_per_gpu=1, backend="cpu", quiet=True, priority=bad)
    with pytest.raises(TypeError, match=r"from -3 to 3"):
        gpupool.Executor(threads_per_gpu=1, backend="cpu", quiet=True, priority=None)
    # Nothing was queued by the refused calls.
    assert ex._core.queued == 0
    assert ex.submit(abs, -2, priority=-3).result(timeout=30) == 2


def test_the_extension_refuses_a_bad_priority_itself(one_lane):
    """Calls that reach the extension unchecked (its own API) are refused there too."""
    with pytest.raises(ValueError, match=r"-3 to 3"):
        one_lane._core.submit_call(print, (), None, concurrent.futures.Future(), None, 9)
    with pytest.raises(ValueError, match=r"-3 to 3"):
        one_lane._core.map_kernel_results(gpupool.kernels.square, [np.ones(4)], None, None, 4,
                                          1 << 20, False, -9)


def test_a_compiled_kernel_map_and_submit_carry_their_priority(one_lane, hold_every_lane):
    ex = one_lane
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x;", "priority_scale")
    xs = [np.arange(100.0) + i for i in range(3)]
    assert np.array_equal(ex.submit(k, xs[0], 2.0).result(timeout=60), 2 * xs[0])  # compiled
    with ex.trace() as t:
        holders, release = hold_every_lane(ex)
        plain = ex.submit(sum, [1])
        mapped = ex.map(k, xs, 3.0, priority=2)
        single = ex.submit(k, xs[0], 0.5, priority=-2)
        release.set()
        out = list(mapped)
        assert plain.result(timeout=30) == 1
        assert np.array_equal(single.result(timeout=30), 0.5 * xs[0])
    assert all(np.array_equal(o, 3 * x) for o, x in zip(out, xs))
    kernels = sorted(r["priority"] for r in t.records() if r["name"] != "task")
    assert kernels == [-2, 2, 2, 2]
    # The map's calls, queued after the plain call, ran before it.
    tasks = sorted((r for r in t.records() if r["name"] == "task"), key=lambda r: r["id"])
    plain_start = tasks[-1]["started"]  # the plain call's (submitted after the holder's)
    assert all(r["started"] < plain_start for r in t.records() if r["priority"] == 2)


def test_an_urgent_small_call_runs_express_and_its_record_says_so(one_lane):
    """A call above the executor's default priority whose arrays hold at most 256 KiB runs in its
    lane's express slot; its trace record says so, an ordinary call's and a larger urgent
    call's do not."""
    ex = one_lane
    small = np.arange(1000, dtype=np.float64)
    large = np.arange(40_000, dtype=np.float64)  # 320 KB: past the express bound
    with ex.trace() as t:
        for x, priority in ((small, None), (small, 1), (large, 1)):
            assert np.array_equal(ex.submit(gpupool.kernels.square, x, priority=priority)
                                  .result(timeout=30), x * x)
    records = sorted(t.records(), key=lambda r: r["id"])
    by_size = [(r["bytes_in"], r["priority"], r["express"]) for r in records]
    assert by_size[0] == (small.nbytes, 0, False)
    assert by_size[1] == (small.nbytes, 1, True)
    assert by_size[2:] and all(not express for _, _, express in by_size[2:])
