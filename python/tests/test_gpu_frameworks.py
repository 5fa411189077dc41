"""On the GPU: CuPy and PyTorch code inside tasks runs on the lane's own stream."""

import threading

import gpupool
from gpupool._lane_streams import _cupy_stream
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_two_lanes_run_cupy_on_two_different_streams():
    cp = pytest.importorskip("cupy")
    barrier = threading.Barrier(2, timeout=30)

    def work(x):
        lane = gpupool.current_lane()
        barrier.wait()  # both tasks are running at once, so on two lanes
        stream = cp.cuda.get_current_stream()
        result = cp.asnumpy(cp.array(x) ** 2)
        return lane.index, lane.stream, stream.ptr, result

    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        x = np.random.default_rng(1).random(1 << 20)
        a, b = ex.submit(work, x), ex.submit(work, x)
        (lane_a, stream_a, cupy_a, ra), (lane_b, stream_b, cupy_b, rb) = a.result(), b.result()
    assert lane_a != lane_b
    assert stream_a != stream_b
    assert (cupy_a, cupy_b) == (stream_a, stream_b)
    assert cupy_a != cp.cuda.Stream.null.ptr
    assert np.array_equal(ra, x * x) and np.array_equal(rb, x * x)


def test_torch_current_stream_is_the_lanes():
    torch = pytest.importorskip("torch")

    def work():
        lane = gpupool.current_lane()
        t = torch.arange(1000, device="cuda", dtype=torch.float64)
        return lane.stream, torch.cuda.current_stream().cuda_stream, float((t * t).sum().cpu())

    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        stream, torch_stream, total = ex.submit(work).result()
    assert stream == torch_stream != 0
    assert total == float(sum(i * i for i in range(1000)))


def test_a_call_that_leaves_another_stream_current_does_not_move_the_next_off_the_lane():
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    other_cupy = cp.cuda.Stream(non_blocking=True)
    other_torch = torch.cuda.Stream()

    def careless():
        other_cupy.use()
        torch.cuda.set_stream(other_torch)
        return gpupool.current_lane().stream

    def look():
        return (gpupool.current_lane().stream, cp.cuda.get_current_stream().ptr,
                torch.cuda.current_stream().cuda_stream)

    with gpupool.Executor(threads_per_gpu=1, backend="cuda", devices=[0]) as ex:
        lane_stream = ex.submit(careless).result()
        assert ex.submit(look).result() == (lane_stream,) * 3


def test_a_result_is_handed_over_only_once_the_work_the_call_left_running_is_done():
    cp = pytest.importorskip("cupy")
    x = cp.random.random(1 << 24)
    cp.cuda.runtime.deviceSynchronize()  # made on CuPy's stream here; read on the lane's

    def leave_work_running():
        y = x
        for _ in range(50):  # tens of milliseconds of kernels, not waited for
            y = cp.sqrt(y * y + 1.0)
        return y, gpupool.current_lane().stream

    with gpupool.Executor(threads_per_gpu=1, backend="cuda", devices=[0]) as ex:
        y, stream = ex.submit(leave_work_running).result()
        # Handed over after the lane's stream finished (not when the call returned).
        # As the package wraps a lane's stream (CuPy 14 deprecates cupy.cuda.ExternalStream).
        assert _cupy_stream(cp, stream, 0).done
        assert bool(cp.isfinite(y).all())

        def wait_for_work():
            return float(cp.asnumpy(cp.sqrt(x * x).sum()))  # waits for its own work

        assert ex.submit(wait_for_work).result() == pytest.approx(float(x.sum()))


def test_a_call_that_waits_for_an_earlier_calls_unfinished_work_does_not_hang():
    # The first call returns with its kernels still running on the lane's stream, so its
    # result is handed over once the stream is done; the second, queued behind it on the one
    # lane, waits for that result. The lane must not run the second before handing the first
    # over: not in the same hold of the GIL, and (one slot) not before the first has ended.
    cp = pytest.importorskip("cupy")
    x = cp.random.random(1 << 24)
    cp.cuda.runtime.deviceSynchronize()

    def leave_work_running():
        y = x
        for _ in range(20):
            y = cp.sqrt(y * y + 1.0)
        return y

    with gpupool.Executor(threads_per_gpu=1, slots_per_lane=1, backend="cuda",
                          devices=[0]) as ex:
        first = ex.submit(leave_work_running)
        second = ex.submit(lambda: float(first.result(timeout=30).sum()))
        assert second.result(timeout=60) > 0


def test_a_call_that_makes_another_gpu_current_leaves_the_lane_on_its_own():
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")

    def switch():
        cp.cuda.Device(1).use()  # and never back

    with gpupool.Executor(threads_per_gpu=1, backend="cuda", devices=[0]) as ex:
        ex.submit(switch).result()
        # The lane's own copies and kernels run on its device afterwards.
        xs = [np.full(1000, float(i)) for i in range(20)]
        for x, r in zip(xs, ex.map(gpupool.kernels.square, xs)):
            assert np.array_equal(r, x * x)
        assert ex.submit(lambda: cp.cuda.runtime.getDevice()).result() == 0


def test_lane_upload_and_download_with_cupy():
    pytest.importorskip("cupy")
    x = np.random.default_rng(2).random(100_000)

    def work():
        lane = gpupool.current_lane()
        d = lane.upload(x)
        d *= 2
        return lane.download(d)

    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        assert np.array_equal(ex.submit(work).result(), 2 * x)


@pytest.mark.parametrize("n, pinned", [(1000, False), (3_000_000, False), (1000, True),
                                       (3_000_000, True)],
                         ids=["small", "several-pieces", "small-pinned", "large-pinned"])
def test_lane_upload_and_download_of_every_size_and_memory(n, pinned):
    # Small pageable inputs are staged holding the GIL, large ones in pieces through two staging
    # buffers in turn, pinned ones copied directly and waited for (the block may be reused
    # right after).
    pytest.importorskip("cupy")
    x = np.random.default_rng(n).random(n)
    if pinned:
        x = gpupool.pinned_array(x)

    def work():
        lane = gpupool.current_lane()
        d = lane.upload(x)
        d += 1.0
        return lane.download(d), lane.download(d, out=np.empty_like(x))

    with gpupool.Executor(threads_per_gpu=2, backend="cuda", chunk_bytes=1 << 20) as ex:
        for pinned_result, pageable_result in [f.result() for f in
                                               [ex.submit(work) for _ in range(8)]]:
            assert np.array_equal(pinned_result, x + 1.0)
            assert np.array_equal(pageable_result, x + 1.0)


def test_lane_download_returns_pinned_memory_from_the_cache():
    pytest.importorskip("cupy")
    x = np.arange(50_000, dtype=np.float64)

    def work():
        lane = gpupool.current_lane()
        return lane.download(lane.upload(x))

    with gpupool.Executor(threads_per_gpu=1, backend="cuda") as ex:
        first = ex.submit(work).result()
        assert gpupool.is_pinned(first) and np.array_equal(first, x)
        del first  # its block goes back to the cache, and the next download takes it again
        cached = gpupool._ext.pinned_memory_stats()["cached"]
        results = [ex.submit(work).result() for _ in range(5)]
        assert all(gpupool.is_pinned(r) and np.array_equal(r, x) for r in results)
        del results
        assert gpupool._ext.pinned_memory_stats()["cached"] >= cached


@pytest.mark.parametrize("hold_us", [0, 1000])
def test_lane_download_keeps_dtype_shape_and_layout_however_long_it_holds_the_gil(hold_us):
    # The extension downloads C-contiguous CuPy arrays of gpupool's dtypes itself; a strided view
    # and a dtype of CuPy's alone go through the Python helper, which copies the view
    # contiguous first. Small copies are waited for holding the GIL (up to hold_us) or not.
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(7)
    cases = {
        "float32 2-D": rng.random((3, 5)).astype(np.float32),
        "int64": rng.integers(-9, 9, 1001),
        "int32 0-length": np.zeros(0, np.int32),
        "float64 large": rng.random(300_000),
        "float16": rng.random(64).astype(np.float16),
        "complex128": rng.random(8) + 1j * rng.random(8),
    }

    def work(x):
        lane = gpupool.current_lane()
        d = cp.asarray(x)
        strided = cp.asarray(np.arange(40.0))[::3]
        return lane.download(d), lane.download(strided)

    before = gpupool._ext._lane_gil_hold_us(hold_us)
    try:
        with gpupool.Executor(threads_per_gpu=4, backend="cuda") as ex:
            futures = {name: ex.submit(work, x) for name, x in cases.items()}
            for name, f in futures.items():
                got, strided = f.result()
                x = cases[name]
                assert got.dtype == x.dtype and got.shape == x.shape, name
                assert np.array_equal(got, x), name
                assert gpupool.is_pinned(got) or got.size == 0, name
                assert np.array_equal(strided, np.arange(40.0)[::3]), name
    finally:
        gpupool._ext._lane_gil_hold_us(before)


def test_lane_download_of_strided_and_contiguous_cupy_arrays_and_into_out():
    # A C-contiguous array of one of gpupool's dtypes is read through CuPy's attributes; a strided
    # one is made contiguous on the lane's stream first; `out` takes the bytes of either.
    cp = pytest.importorskip("cupy")
    x = np.arange(1000.0)

    def task():
        lane = gpupool.current_lane()
        whole = lane.download(cp.asarray(x))
        strided = lane.download(cp.asarray(x)[::2])
        into = gpupool.empty_pinned(500, np.float64)
        same = lane.download(cp.asarray(x)[::2], out=into)
        return whole, strided, into, same

    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        whole, strided, into, same = ex.submit(task).result()
    assert np.array_equal(whole, x)
    assert np.array_equal(strided, x[::2])
    assert same is into and np.array_equal(into, x[::2])


def test_many_lanes_each_downloading_small_arrays_while_holding_the_gil_get_their_own():
    # Lanes that wait for small copies holding the GIL still each get their own results, and a
    # long kernel behind a copy (longer than the hold) is waited for without the GIL.
    cp = pytest.importorskip("cupy")
    xs = [np.random.default_rng(i).random(512) for i in range(400)]

    def square(x):
        lane = gpupool.current_lane()
        d = lane.upload(x)
        return lane.download(d * d)

    def slow(x):
        lane = gpupool.current_lane()
        d = lane.upload(x)
        spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long n) {
            long long t = clock64(); while (clock64() - t < n) {} }""", "spin")
        spin((1,), (1,), (np.int64(20_000_000),))  # about 10 ms
        return lane.download(d + 1)

    before = gpupool._ext._lane_gil_hold_us(1000)
    try:
        with gpupool.Executor(threads_per_gpu=8, backend="cuda") as ex:
            slow_result = ex.submit(slow, xs[0])
            for x, r in zip(xs, ex.map(square, xs)):
                assert np.array_equal(r, x * x)
            assert np.array_equal(slow_result.result(), xs[0] + 1)
    finally:
        gpupool._ext._lane_gil_hold_us(before)


def test_a_map_over_cupy_arrays_writes_given_outputs_in_place():
    cp = pytest.importorskip("cupy")
    k = gpupool.elementwise("float32 x, float32 a", "float32 y", "y = a * x + 1.0f",
                            "gpu_given_outputs")
    data = cp.random.default_rng(5).random(70 * 1000, dtype=cp.float32)
    xs = [data[i * 1000:(i + 1) * 1000] for i in range(70)]  # two blocks
    expected = [x * 2 + 1 for x in xs]
    outs = [cp.full(1000, cp.nan, cp.float32) for _ in range(70)]
    with gpupool.Executor(threads_per_gpu=4, backend="cuda") as ex:
        results = list(ex.map(k, xs, 2.0, out=outs))
        assert all(r is o for r, o in zip(results, outs))
        for o, e in zip(outs, expected):
            assert cp.allclose(o, e)
        in_place = list(ex.map(k, xs, 2.0, out=xs))  # each call over its own input
        assert all(r is x for r, x in zip(in_place, xs))
        for x, e in zip(xs, expected):
            assert cp.allclose(x, e)
        with pytest.raises(ValueError, match="call 1 reads memory that call 0 writes"):
            ex.map(k, xs[:2], 2.0, out=[xs[1], outs[1]])
        with pytest.raises(TypeError, match="writes float32"):
            ex.map(k, xs[:1], 2.0, out=[cp.empty(1000, cp.float64)])


def test_map_into_writes_every_cupy_calls_result_into_one_array_end_to_end():
    cp = pytest.importorskip("cupy")
    k = gpupool.elementwise("float32 x, float32 a", "float32 y", "y = a * x + 1.0f",
                            "gpu_map_into")
    rng = cp.random.default_rng(6)
    sizes = [(i * 37) % 500 for i in range(300)]  # some empty; three blocks
    xs = [rng.random(n, dtype=cp.float32) for n in sizes]
    out = cp.full(sum(sizes), cp.nan, cp.float32)
    with gpupool.Executor(threads_per_gpu=4, backend="cuda") as ex:
        assert ex.map_into(k, xs, 2.0, out=out) is out
        assert cp.allclose(out, cp.concatenate([x * 2 + 1 for x in xs]))
        # Each call over its own part of one array: in place.
        data = rng.random(70 * 1000, dtype=cp.float32)
        expected = data * 2 + 1
        rows = data.reshape(70, 1000)
        assert ex.map_into(k, list(rows), 2.0, out=rows) is rows
        assert cp.allclose(data, expected)
        with pytest.raises(ValueError, match="out holds 999 element\\(s\\); call 0 and those "
                                             "before it write 1000"):
            ex.map_into(k, [cp.ones(1000, cp.float32)], 2.0, out=cp.empty(999, cp.float32))
        with pytest.raises(ValueError, match="call 1 reads memory that call 0 writes"):
            ex.map_into(k, [data[:10], data[10:20]], 2.0, out=data[10:30])


def test_cuda_error_carries_the_cuda_error_name():
    out = gpupool.empty_pinned(512, np.float64)

    def bad_copy():
        gpupool.current_lane()._download(out, 0x10)

    with gpupool.Executor(threads_per_gpu=1, backend="cuda") as ex:
        with pytest.raises(gpupool.CudaError) as info:
            ex.submit(bad_copy).result()
        assert info.value.name.startswith("cudaError")
        assert ex.submit(lambda: 1).result() == 1


def test_kernels_over_cupy_arrays_stay_on_the_gpu():
    cp = pytest.importorskip("cupy")
    rng = cp.random.default_rng(3)
    xs = [rng.random(n, dtype=cp.float64) for n in (1, 1000, 300_000)]
    ys = [rng.random(x.shape, dtype=cp.float64) for x in xs]
    ints = [cp.arange(-500, 500, dtype=cp.int32)]
    with gpupool.Executor(threads_per_gpu=4, backend="cuda") as ex:
        squares = list(ex.map(gpupool.kernels.square, xs))
        sums = list(ex.map(gpupool.kernels.axpy(2.0), xs, ys))
        int_squares = ex.submit(gpupool.kernels.square, ints[0]).result()
        with pytest.raises(ValueError, match="not C-contiguous"):
            ex.map(gpupool.kernels.square, [cp.ones(10)[::2]])
        with pytest.raises(ValueError, match="differ"):
            ex.map(gpupool.kernels.add, [xs[1]], [ys[1].astype(cp.float32)])
    for got, x, y, s in zip(squares, xs, ys, sums):
        assert isinstance(got, cp.ndarray) and isinstance(s, cp.ndarray)
        assert cp.allclose(got, x * x, rtol=1e-15) and cp.allclose(s, 2 * x + y, rtol=1e-15)
    assert cp.array_equal(int_squares, ints[0] * ints[0])


def test_kernels_over_torch_tensors_stay_on_the_gpu():
    torch = pytest.importorskip("torch")
    x = torch.rand(100_000, device="cuda", dtype=torch.float32)
    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        (out,) = ex.map(gpupool.kernels.scale(3.0), [x])
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert torch.allclose(out, 3 * x)
