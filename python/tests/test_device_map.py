"""The extension's bookkeeping for compiled kernels over many device arrays (Executor.map over
CuPy arrays): C++ reads every call into plain data, checks, groups and queues it, block by block,
as _device.map_compiled drives it (an _ext.DeviceMapRun); Python only makes the output buffers and
their views. On the CPU backend host memory stands in for device memory: NumPy arrays are passed
here as fake CuPy arrays and as objects speaking the CUDA Array Interface (which the extension
takes as GPU 0's memory once _take_host_memory_as_device is set);
python/tests/test_gpu_frameworks.py runs it on CuPy."""

import concurrent.futures as cf
import gc
import sys
import threading
import time
import types

import gpupool
import numpy as np
import pytest
from gpupool import _device, _ext
from gpupool._executor import _Future

SCALE = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = x * a", "device_map_scale")


class FakeCupyArray:
    """What the extension reads of a CuPy array (dtype, flags, data.ptr, data.device_id, size,
    ndim, shape), over a NumPy array."""

    class _Flags:
        def __init__(self, contiguous):
            self.c_contiguous = contiguous

    class _Memory:
        def __init__(self, ptr, device_id):
            self.ptr = ptr
            self.device_id = device_id

    def __init__(self, host, device_id=0):
        self.host = host
        self.dtype = host.dtype
        self.flags = self._Flags(host.flags.c_contiguous)
        self.data = self._Memory(host.ctypes.data, device_id)
        self.size = host.size
        self.ndim = host.ndim
        self.shape = host.shape


class FakeCupyArrayWithFlag(FakeCupyArray):
    """As CuPy's ndarray also has it: a readonly `_c_contiguous`, read instead of `flags`."""

    def __init__(self, host, device_id=0):
        super().__init__(host, device_id)
        self._c_contiguous = host.flags.c_contiguous
        del self.flags  # must not be needed


class CudaArray:
    """A NumPy array behind the CUDA Array Interface (v3), as PyTorch or Numba would offer one:
    the extension reads its dict."""

    def __init__(self, host, stream=None, typestr=None):
        self.host = host
        strides = None if host.flags.c_contiguous else host.strides
        self.__cuda_array_interface__ = {
            "data": (host.ctypes.data, False), "shape": host.shape,
            "typestr": typestr or host.dtype.str, "strides": strides, "version": 3,
            "stream": stream}


class ReadOnly(CudaArray):
    """An array whose CUDA Array Interface marks it read-only."""

    def __init__(self, host):
        super().__init__(host)
        self.__cuda_array_interface__["data"] = (host.ctypes.data, True)


class DLPackOnly:
    """An array offering only DLPack, on a CUDA device."""

    def __init__(self, host):
        self.host = host

    def __dlpack_device__(self):
        return (2, 0)


@pytest.fixture(autouse=True)
def host_memory_as_device():
    """Host memory (which describe_pointer does not know without a GPU) read as GPU 0's."""
    before = _ext._take_host_memory_as_device(True)
    yield
    _ext._take_host_memory_as_device(before)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in for the cupy module, as the extension and _device use it: its ndarray type,
    from_dlpack and the current stream's handle."""
    module = types.ModuleType("cupy")
    module.ndarray = FakeCupyArray
    module.from_dlpack = lambda a: CudaArray(a.host)
    stream = types.SimpleNamespace(ptr=0)
    module.cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def dev(x):
    return CudaArray(x)


class Flats:
    """Output buffers for a run: one NumPy buffer per group, remembered."""

    def __init__(self):
        self.made = []
        self.made_arrays = []

    def __call__(self, anchor, ordinal, count, dtype):
        flat = np.full(count, -1.0, dtype)
        self.made.append((ordinal, count, dtype))
        self.made_arrays.append(flat)
        return flat, flat.ctypes.data


@pytest.fixture
def core():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        yield ex._core


def start(core, calls, cupy_type=None, out=None, single=False, kernel=SCALE, priority=None,
          wait_streams=(), one_out=False):
    return core.map_device_calls(kernel, calls, cupy_type, out, one_out, single, priority,
                                 tuple(calls), _Future, list(wait_streams))


def drive(run, flats=None, split=np.split, before_queue=None, single=False, given=False):
    """Steps a run as _device.map_compiled does, with NumPy buffers: (outputs, futures)."""
    flats = flats if flats is not None else Flats()
    pieces = []
    try:
        while (needed := run.read_block()) is not None:
            if not given:
                run.give_buffers([flats(*need) for need in needed])
            if single:
                pieces += [split(flat, ends) for flat, ends in run.cuts()]
            if before_queue is not None:
                before_queue()
            run.queue_block()
        pieces += [split(flat, ends) for flat, ends in run.cuts()]
        return run.finish(pieces)
    except BaseException:
        run.abandon()
        raise


def run(core, calls, cupy_type=None, flats=None, out=None):
    flats = flats or Flats()
    launched = []
    outputs, futures = drive(start(core, calls, cupy_type, out), flats,
                             before_queue=lambda: launched.append(len(flats.made)),
                             given=out is not None)
    assert all(isinstance(f, cf.Future) for f in futures)
    # One future for the whole map, whatever the blocks and devices: its result is the outputs.
    assert len(futures) == 1
    done = futures[0].result(timeout=30)
    assert len(done) == len(outputs) and all(a is b for a, b in zip(done, outputs))
    return outputs, futures, flats, launched


def refused(core, calls, error, message, cupy_type=None, out=None, kernel=SCALE):
    """Checks that the map raises `error` before anything is allocated or queued."""
    flats = Flats()
    with pytest.raises(error, match=message):
        drive(start(core, calls, cupy_type, out, kernel=kernel), flats,
              before_queue=lambda: pytest.fail("queued"), given=out is not None)
    assert flats.made == []


def test_many_arrays_in_one_call_each_output_a_view_of_one_buffer(core):
    xs = [np.arange(n, dtype=np.float64) for n in (3, 1, 0, 1000, 7)]
    xs.append(np.arange(12, dtype=np.float64).reshape(3, 4))
    outputs, futures, flats, launched = run(core, [[dev(x), 2.5] for x in xs])
    assert len(outputs) == len(xs)
    for x, out in zip(xs, outputs):
        assert out.shape == x.shape
        np.testing.assert_array_equal(out, x * 2.5)
    assert flats.made == [(0, sum(x.size for x in xs), "float64")]
    assert launched == [1]  # once, after everything was checked and allocated


def test_each_device_buffer_is_cut_into_views_by_one_call(core):
    cuts = []

    def split(flat, ends):
        cuts.append(list(ends))
        return np.split(flat, ends)

    xs = [np.arange(n, dtype=np.float64) for n in (2, 0, 5)]
    outputs, futures = drive(start(core, [[dev(x), 3.0] for x in xs]), split=split)
    assert cuts == [[2, 2, 7]]  # once, with each call's end in the one buffer
    futures[0].result(timeout=30)  # the outputs are written once the map's future is done
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 3.0)


def test_the_buffers_are_cut_only_once_everything_is_queued(core):
    # Views take CuPy microseconds each: the GPUs compute meanwhile. A group is cut once.
    run = start(core, [[dev(np.ones(3)), 1.0] for _ in range(100)])
    flats = Flats()
    run.give_buffers([flats(*need) for need in run.read_block()])
    assert [(flat is flats.made_arrays[0], ends[-1]) for flat, ends in run.cuts()] == [(True, 192)]
    assert run.cuts() == []
    run.queue_block()
    run.give_buffers([flats(*need) for need in run.read_block()])
    run.queue_block()
    assert run.read_block() is None
    assert [len(ends) for _, ends in run.cuts()] == [36]
    with pytest.raises(ValueError, match="views of 2 buffer"):
        run.finish([np.split(flats.made_arrays[1], [3])])
    run.abandon()


def test_a_split_that_gives_too_few_views_is_an_error_and_the_executor_goes_on(core):
    xs = [np.arange(4, dtype=np.float64) for _ in range(3)]
    with pytest.raises(RuntimeError, match="fewer views than calls"):
        drive(start(core, [[dev(x), 1.0] for x in xs]), split=lambda flat, ends: [flat])
    outputs, _, _, _ = run(core, [[dev(x), 2.0] for x in xs])
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 2.0)


def test_the_views_of_a_pytorch_buffer_come_from_its_tensor_split():
    # _split_flat tells the two kinds of buffer apart by their module; both give every call's
    # view and the rest of the buffer last.
    from gpupool import _device

    class FakeTensor:
        __module__ = "torch"

        def __init__(self, host):
            self.host = host

        def tensor_split(self, ends):
            return [FakeTensor(h) for h in np.split(self.host, ends)]

    pieces = _device._split_flat(FakeTensor(np.arange(10.0)), [3, 3, 7])
    assert [p.host.tolist() for p in pieces] == [[0, 1, 2], [], [3, 4, 5, 6], [7, 8, 9]]



@pytest.mark.parametrize("fake", [FakeCupyArray, FakeCupyArrayWithFlag])
def test_cupy_arrays_are_read_through_their_own_attributes(core, fake):
    # CuPy's readonly _c_contiguous is read when there is one, flags.c_contiguous otherwise.
    xs = [np.arange(n, dtype=np.float64) for n in (5, 64)]
    calls = [[fake(x), 3.0] for x in xs]
    outputs, _, _, _ = run(core, calls, cupy_type=fake)
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 3.0)


def test_cupys_contiguity_flag_refuses_a_strided_array(core):
    strided = FakeCupyArrayWithFlag(np.ones((4, 4))[:, 1])
    refused(core, [[strided, 1.0]], ValueError, "call 0 argument 0 is not C-contiguous",
            cupy_type=FakeCupyArrayWithFlag)


def test_a_number_given_to_every_call_is_checked_once_and_each_call_gets_its_own(core):
    xs = [np.arange(4, dtype=np.float64) + i for i in range(6)]
    broadcast = 2.0
    calls = [[dev(x), broadcast if i % 3 else float(i)] for i, x in enumerate(xs)]
    outputs, _, _, _ = run(core, calls)
    for i, (x, out) in enumerate(zip(xs, outputs)):
        np.testing.assert_array_equal(out, x * (2.0 if i % 3 else float(i)))
    # The one check still refuses, in every call.
    refused(core, [[dev(x), 2**40] for x in xs], OverflowError, r"\(call 0\)",
            kernel=gpupool.elementwise("float64 x, int32 a", "float64 y", "y = x * a",
                                       "device_map_int"))


@pytest.mark.parametrize("calls, error, message", [
    (lambda x: [[x]], TypeError, "takes 2 argument"),
    (lambda x: [[x, 1.0], [2.0, 1.0]], TypeError, "call 1 of kernel 'device_map_scale' has no"),
    (lambda x: [[x, "two"]], TypeError, "call 0 argument 1 is not a device array"),
    (lambda x: [[np.ones(4), 1.0]], TypeError,
     r"call 0 argument 0 is not a device array; a map over device arrays takes device arrays "
     r"and numbers only \(host arrays go in a map of their own\)"),
    (lambda x: [[x, 1j]], TypeError, "complex"),
    (lambda x: [[FakeCupyArray(np.ones(4, np.float16)), 1.0]], TypeError, "unsupported dtype"),
    (lambda x: [[FakeCupyArray(np.ones((4, 4))[:, 1]), 1.0]], ValueError, "not C-contiguous"),
    (lambda x: [[CudaArray(np.ones(4, np.float16)), 1.0]], TypeError,
     "call 0 argument 0 has unsupported dtype float16"),
    (lambda x: [[CudaArray(np.ones((4, 4))[:, 1]), 1.0]], ValueError,
     "call 0 argument 0 is not C-contiguous; make a contiguous copy"),
])
def test_a_bad_call_in_the_first_block_stops_the_map_before_anything_runs(core, calls, error,
                                                                          message):
    refused(core, calls(dev(np.ones(4))), error, message, cupy_type=FakeCupyArray)


def test_long_maps_are_queued_in_growing_blocks_while_later_calls_are_read(core):
    # 64 calls, then 128, then 256 at a time and the rest: each block is checked, given its
    # buffer and queued (after the streams are waited for) before the next one is read; the
    # outputs are in call order.
    xs = [np.arange(i % 7 + 1, dtype=np.float64) + i for i in range(1000)]
    outputs, futures, flats, launched = run(core, [[dev(x), 0.5] for x in xs])
    blocks = [64, 128, 256, 256, 256, 40]
    assert sum(blocks) == len(xs)
    assert flats.made == [(0, sum(x.size for x in xs[sum(blocks[:b]):sum(blocks[:b + 1])]),
                           "float64") for b in range(len(blocks))]
    assert launched == [1, 2, 3, 4, 5, 6]  # each block is given its buffer, then queued
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 0.5)


def test_the_maps_one_future_cancels_every_block_that_has_not_started():
    # Both lanes held by Python calls: the map's blocks wait in the queue, so cancelling its one
    # future cancels all of them and the future ends cancelled; the lanes then go on.

    release = threading.Event()
    started = threading.Barrier(3, timeout=30)

    def hold() -> bool:
        started.wait()
        return release.wait(30)

    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        holders = [ex.submit(hold) for _ in range(2)]
        started.wait()  # both lanes are inside a call before the map's blocks are queued
        xs = [np.arange(3, dtype=np.float64) for _ in range(300)]
        try:
            _, futures = drive(start(ex._core, [[dev(x), 2.0] for x in xs]))
            assert len(futures) == 1
            assert futures[0].cancel() and futures[0].cancelled()
        finally:
            release.set()
        assert all(h.result(timeout=30) for h in holders)
        outputs, _, _, _ = run(ex._core, [[dev(x), 4.0] for x in xs])
        np.testing.assert_array_equal(outputs[-1], xs[-1] * 4.0)


def test_cancelling_a_map_whose_first_block_ran_cancels_the_rest_and_ends_it_cancelled():
    # One lane. Before the second block is queued, the first has run and a Python call holds
    # the lane: the later blocks wait behind it. cancel() then cancels them and succeeds, and
    # the future ends cancelled though its first block ran; the lane goes on afterwards.
    release = threading.Event()
    holding = threading.Event()
    flats = Flats()
    holder = []
    xs = [np.arange(3, dtype=np.float64) + i for i in range(300)]

    def hold() -> bool:
        holding.set()
        return release.wait(30)

    def before_queue():
        if len(flats.made) == 2:  # the first block was queued before this
            first = flats.made_arrays[0]
            deadline = time.monotonic() + 30
            while first[-1] == -1.0 and time.monotonic() < deadline:
                time.sleep(0.001)
            holder.append(ex.submit(hold))
            # The lane must be in the call before the next block is queued: a lane that wakes to
            # find both may take its device's block first (the map's blocks are queued for that
            # device, the call for any).
            assert holding.wait(30)

    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        try:
            outputs, futures = drive(start(ex._core, [[dev(x), 2.0] for x in xs]), flats,
                                     before_queue=before_queue)
            assert futures[0].cancel() and futures[0].cancelled()
        finally:
            release.set()
        with pytest.raises(cf.CancelledError):
            futures[0].result(timeout=30)
        assert holder[0].result(timeout=30)
        for x, out in zip(xs[:64], outputs[:64]):  # the block that ran
            np.testing.assert_array_equal(out, x * 2.0)
        again, _, _, _ = run(ex._core, [[dev(x), 5.0] for x in xs])
        np.testing.assert_array_equal(again[-1], xs[-1] * 5.0)


def test_calls_on_two_devices_are_named_by_their_place_in_the_whole_map():
    # Calls alternate between two stand-in devices: each block has a group per device, and a
    # call refused by its group's check is still named by its index among all the calls.
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=2) as ex:
        xs = [np.arange(4, dtype=np.float64) + i for i in range(300)]
        calls = [[FakeCupyArray(x, i % 2), 1.5] for i, x in enumerate(xs)]
        outputs, _, flats, _ = run(ex._core, calls, cupy_type=FakeCupyArray)
        assert [ordinal for ordinal, _, _ in flats.made[:2]] == [0, 1]  # one buffer each
        for x, out in zip(xs, outputs):
            np.testing.assert_array_equal(out, x * 1.5)
        calls[151] = [FakeCupyArray(xs[151].astype(np.float32), 1), 1.5]
        with pytest.raises(ValueError, match=r"float32 array.*\(call 151\)"):
            run(ex._core, calls, cupy_type=FakeCupyArray)


@pytest.mark.parametrize("bad, error, message, queued", [
    # Refused while its block is read: only the first block (calls 0-63) was queued.
    (lambda x: [x, "two"], TypeError, "call 150 argument 1 is not a device array", [1]),
    (lambda x: [CudaArray(x.host[:2]), x], ValueError, r"mixes arrays and scalars.*\(call 150\)",
     [1]),
    # Refused by map_on_device's own check of its block (calls 64-191), numbered within it.
    (lambda x: [CudaArray(x.host.astype(np.float32)), 1.0], ValueError,
     r"float32 array.*\(call 150\)", [1, 2]),
    # Refusals that name only the argument get the call's number too.
    (lambda x: [x, 2**1100], OverflowError, r"\(call 150\)", [1]),
    (lambda x: [x], TypeError, r"takes 2 argument.*\(call 150\)", [1]),
])
def test_a_bad_call_in_a_later_block_stops_the_map_and_the_executor_goes_on(core, bad, error,
                                                                            message, queued):
    # The blocks queued before it run into buffers nobody gets (or are cancelled); the error
    # names the call by its place in the whole map, and the next map runs as usual.
    xs = [np.arange(5, dtype=np.float64) + i for i in range(300)]
    calls = [[dev(x), 2.0] for x in xs]
    calls[150] = bad(dev(xs[150]))
    flats, launched = Flats(), []
    with pytest.raises(error, match=message):
        drive(start(core, calls), flats, before_queue=lambda: launched.append(len(flats.made)))
    assert launched == queued
    assert flats.made[0] == (0, 64 * 5, "float64")
    outputs, _, _, _ = run(core, [[dev(x), 3.0] for x in xs])
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 3.0)


def test_arrays_of_one_call_on_two_gpus_are_refused(core):
    two = gpupool.elementwise("float64 x, float64 z", "float64 y", "y = x + z", "device_map_add")
    calls = [[FakeCupyArray(np.ones(4), 0), FakeCupyArray(np.ones(4), 1)]]
    refused(core, calls, ValueError, "arrays on GPUs 0 and 1", cupy_type=FakeCupyArray,
            kernel=two)


def test_one_call_gives_one_future_whose_result_is_its_output(core):
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    cut_before_queued = []
    run = start(core, [[dev(x), 4.0]], single=True)
    outputs, futures = drive(run, single=True,
                             before_queue=lambda: cut_before_queued.append(run.cuts() == []))
    assert cut_before_queued == [True]  # its view was made before it was queued
    assert len(futures) == 1 and futures[0].result(timeout=30) is outputs[0]
    np.testing.assert_array_equal(outputs[0], x * 4.0)
    with pytest.raises(ValueError, match="exactly one call"):
        start(core, [[dev(x), 1.0], [dev(x), 1.0]], single=True)


def test_a_priority_is_taken_by_every_batch(core):
    xs = [np.arange(4, dtype=np.float64) + i for i in range(100)]
    outputs, futures = drive(start(core, [[dev(x), 2.0] for x in xs], priority=3))
    futures[0].result(timeout=30)
    np.testing.assert_array_equal(outputs[-1], xs[-1] * 2.0)


def test_a_run_dropped_unfinished_leaves_nothing_running(hold_every_lane):
    # Its blocks write into buffers only the run holds: a run Python lets go of without
    # finishing or abandoning it cancels what has not started and waits for the rest.
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        holders, release = hold_every_lane(ex)
        flats = Flats()
        run = start(ex._core, [[dev(np.ones(3)), 2.0] for _ in range(100)])
        run.give_buffers([flats(*need) for need in run.read_block()])
        run.queue_block()
        del run
        gc.collect()
        release.set()
        for h in holders:
            h.result(timeout=30)
        ex.submit(len, []).result(timeout=30)  # the lane is free: nothing of the map ran
        assert (flats.made_arrays[0] == -1.0).all()


def test_the_calls_and_buffers_are_held_until_the_batches_end(hold_every_lane):
    # The batches read the calls' arrays and write the buffers after the run and its outputs
    # are gone: the map's future holds them (keep_alive) until the last batch has ended.
    import weakref

    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        holders, release = hold_every_lane(ex)
        x = dev(np.ones(3))
        flats = Flats()
        outputs, futures = drive(start(ex._core, [[x, 2.0]] * 100), flats)
        held = [weakref.ref(x), weakref.ref(flats.made_arrays[0])]
        del x, outputs, flats
        gc.collect()
        assert all(ref() is not None for ref in held)
        release.set()
        futures[0].result(timeout=30)
        for h in holders:
            h.result(timeout=30)
        del futures
        gc.collect()
        assert all(ref() is None for ref in held)


def test_a_runs_steps_are_taken_in_order_and_not_after_it_ended(core):
    run = start(core, [[dev(np.ones(3)), 2.0]])
    with pytest.raises(RuntimeError, match="out of order"):
        run.queue_block()
    needed = run.read_block()
    with pytest.raises(RuntimeError, match="out of order"):
        run.finish([])
    with pytest.raises(ValueError, match="1 group\\(s\\) need a buffer each; 0 given"):
        run.give_buffers([])
    with pytest.raises(RuntimeError, match="has ended"):  # a failure ends the run
        run.give_buffers([Flats()(*needed[0])])
    run.abandon()
    run.abandon()  # as often as the caller's error paths call it
    run = start(core, [[dev(np.ones(3)), 2.0]])
    outputs, futures = drive(run)
    with pytest.raises(RuntimeError, match="has ended"):
        run.read_block()
    run.abandon()  # nothing to stop: the map's future has its batches
    assert futures[0].result(timeout=30) == outputs
    np.testing.assert_array_equal(outputs[0], np.full(3, 2.0))


@pytest.mark.gpu
def test_w5_many_cupy_arrays_through_executor_map():
    cp = pytest.importorskip("cupy")
    if not gpupool.cuda_available()[0]:
        pytest.skip("no usable GPU")
    k = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y", "y = x * a + b",
                            "device_map_w5")
    chunks = [cp.arange(n, dtype=cp.float32) for n in [16384, 1, 0, 300] * 500]
    with gpupool.Executor(backend="cuda") as ex:
        out = list(ex.map(k, chunks, 2.0, 1.0))
    assert len(out) == len(chunks)
    for o, c in zip(out[:8], chunks[:8]):
        assert isinstance(o, cp.ndarray) and o.shape == c.shape
        cp.testing.assert_array_equal(o, c * 2 + 1)
    # Views into one buffer per device and block (64 calls, then 128, then 256 at a time), as
    # the one-call bookkeeping makes them, each where its call's elements are, C-contiguous like
    # any new array.
    pairs = list(zip(out, chunks))
    begin, size, buffers = 0, 64, set()
    while begin < len(pairs):
        block = pairs[begin:begin + size]
        memory = {o.data.mem.ptr for o, _ in block if o.size}
        assert len(memory) == 1 and not memory & buffers, f"block from call {begin}"
        buffers |= memory
        offset = block[0][0].data.ptr
        for o, c in block:
            assert o.flags.c_contiguous and o.shape == c.shape
            assert o.data.ptr == offset or o.size == 0
            offset += c.nbytes
        begin, size = begin + size, min(size * 2, 256)
    assert len(buffers) == 10  # 64 + 128 calls, seven blocks of 256, and the last 16
    cp.testing.assert_array_equal(cp.concatenate(out), cp.concatenate(chunks) * 2 + 1)



# Given outputs (Executor.map(..., out=...)) ------------------------------------------------------


@pytest.mark.parametrize("fake", [None, FakeCupyArrayWithFlag])
def test_given_outputs_are_written_and_returned_and_nothing_is_allocated(core, fake):
    xs = [np.arange(n, dtype=np.float64) for n in (3, 0, 100, 7)]
    outs = [np.full(x.shape, -1.0) for x in xs]
    wrap = fake or dev
    given = [wrap(o) for o in outs]
    outputs, _, flats, launched = run(core, [[wrap(x), 2.5] for x in xs], cupy_type=fake,
                                          out=given)
    assert all(a is b for a, b in zip(outputs, given))
    for x, o in zip(xs, outs):
        np.testing.assert_array_equal(o, x * 2.5)
    assert flats.made == [] and launched == [0]


def test_a_given_output_may_be_its_own_calls_input(core):
    xs = [np.arange(5, dtype=np.float64) + i for i in range(70)]  # two blocks
    expected = [x * 3.0 for x in xs]
    arrays = [dev(x) for x in xs]
    outputs, _, _, _ = run(core, [[a, 3.0] for a in arrays], out=arrays)
    for out, a, x, e in zip(outputs, arrays, xs, expected):
        assert out is a
        np.testing.assert_array_equal(x, e)


def test_outputs_in_one_buffer_side_by_side_are_not_a_hazard(core):
    flat = np.full(40, -1.0)
    outs = [dev(o) for o in np.split(flat, 4)]
    xs = [np.arange(10, dtype=np.float64) * (i + 1) for i in range(4)]
    run(core, [[dev(x), 2.0] for x in xs], out=outs)
    np.testing.assert_array_equal(flat, np.concatenate(xs) * 2.0)


@pytest.mark.parametrize("layout, message", [
    # call 0 writes what call 1 reads
    (lambda base, spare: [base[8:16], spare[1]], "call 1 reads memory that call 0 writes"),
    # call 1 writes what call 0 read
    (lambda base, spare: [spare[0], base[0:8]], "call 1 writes memory that call 0 reads"),
    # two calls write one array
    (lambda base, spare: [spare[0], spare[0]], "call 1 writes memory that call 0 writes too"),
    # a call writes over its own input, shifted by one element
    (lambda base, spare: [base[1:9], spare[1]],
     "call 0 writes memory that it or another call reads"),
])
def test_a_call_writing_what_another_reads_or_writes_is_refused_before_anything_runs(
        core, layout, message):
    base = np.arange(20, dtype=np.float64)
    xs = [base[0:8], base[8:16]]
    spare = [np.full(8, -1.0), np.full(8, -1.0)]
    refused(core, [[dev(x), 2.0] for x in xs], ValueError, message,
            out=[dev(o) for o in layout(base, spare)])
    np.testing.assert_array_equal(base, np.arange(20, dtype=np.float64))
    assert all((s == -1.0).all() for s in spare)


def test_an_input_several_calls_share_may_not_be_written(core):
    x = dev(np.arange(6, dtype=np.float64))
    refused(core, [[x, 2.0], [x, 3.0]], ValueError,
            "call 1 writes memory that it or another call reads", out=[dev(np.empty(6)), x])


@pytest.mark.parametrize("out, error, message", [
    ([np.empty(4), np.empty(5)], ValueError, "call 1's output has 5 element\\(s\\), the call 4"),
    ([np.empty(4), np.empty(4, np.float32)], TypeError, "call 1's output is float32; kernel "
     "'device_map_scale' writes float64"),
    ([np.empty(4), "nope"], TypeError, "call 1's output is not a device array"),
    ([np.empty(4), FakeCupyArrayWithFlag(np.ones((4, 2))[:, 0])], ValueError,
     "call 1's output is not C-contiguous"),
    ([np.empty(4), np.ones((4, 2))[:, 0]], ValueError,
     "call 1's output is not C-contiguous; make a contiguous copy"),
    ([np.empty(4), FakeCupyArrayWithFlag(np.ones(4), 1)], ValueError,
     "call 1's output is on GPU 1, the call's arrays on GPU 0"),
    ([np.empty(4), ReadOnly(np.empty(4))], ValueError, "call 1's output is read-only"),
])
def test_a_given_output_that_does_not_fit_its_call_is_refused(core, out, error, message):
    xs = [np.ones(4), np.ones(4)]
    given = [dev(o) if isinstance(o, np.ndarray) else o for o in out]
    refused(core, [[dev(x), 2.0] for x in xs], error, message, out=given,
            cupy_type=FakeCupyArrayWithFlag)


def test_out_must_give_one_array_per_call(core):
    with pytest.raises(ValueError, match="out has 1 array\\(s\\) for 2 call\\(s\\)"):
        start(core, [[dev(np.ones(4)), 2.0]] * 2, out=[dev(np.empty(4))])
    with pytest.raises(ValueError, match="out is for maps, not single"):
        start(core, [[dev(np.ones(4)), 2.0]], out=[dev(np.empty(4))], single=True)


# One output array for every call (Executor.map_into) --------------------------------------------


def into(core, calls, out, cupy_type=None):
    """Runs `calls` writing into the one array `out`: (outputs, the map's future's result)."""
    outputs, futures = drive(start(core, calls, cupy_type, out, one_out=True), given=True)
    assert len(futures) == 1
    return outputs, futures[0].result(timeout=30)


@pytest.mark.parametrize("wrap", [dev, FakeCupyArrayWithFlag])
def test_one_output_array_takes_every_calls_result_end_to_end(core, wrap):
    xs = [np.arange((i * 37) % 50, dtype=np.float64) + i for i in range(300)]  # three blocks
    flat = np.full(sum(x.size for x in xs), -1.0)
    given = wrap(flat)
    calls = [[wrap(x), 2.5] for x in xs]
    outputs, result = into(core, calls, given, cupy_type=FakeCupyArrayWithFlag)
    # No object per call: the map's result is the array given.
    assert outputs == [] and result is given
    np.testing.assert_array_equal(flat, np.concatenate(xs) * 2.5)


def test_one_output_array_may_have_any_shape_and_be_the_calls_inputs(core):
    base = np.arange(70 * 6, dtype=np.float64).reshape(70, 6)  # a row per call, two blocks
    expected = base * 3.0
    into(core, [[dev(row), 3.0] for row in base], dev(base))
    np.testing.assert_array_equal(base, expected)
    empty = np.empty((0, 4))
    assert into(core, [], dev(empty))[0] == []


def queued_blocks(core, calls, out, error, message):
    """Runs `calls` into the one array `out`, which must be refused with `error` matching
    `message`: how many blocks were queued before the refusal."""
    queued = []
    with pytest.raises(error, match=message):
        drive(start(core, calls, out=out, one_out=True), given=True,
              before_queue=lambda: queued.append(1))
    return len(queued)


def test_an_output_array_too_small_is_refused_at_the_call_it_cannot_hold(core):
    xs = [np.ones(8) for _ in range(100)]  # call 70 is in the second block
    flat = np.full(8 * 70 + 3, -1.0)
    assert queued_blocks(core, [[dev(x), 2.0] for x in xs], dev(flat), ValueError,
                         r"out holds 563 element\(s\); call 70 and those before it write "
                         r"568$") == 1
    # The first block's calls ran (or were cancelled); nothing was written past them.
    assert set(np.unique(flat[:64 * 8])) <= {-1.0, 2.0} and (flat[64 * 8:] == -1.0).all()


@pytest.mark.parametrize("calls, blocks", [(2, 0), (64, 0), (100, 1)])
def test_an_output_array_too_large_is_refused_before_the_last_block_runs(core, calls, blocks):
    flat = np.full(6 * calls + 1, -1.0)
    assert queued_blocks(core, [[dev(np.ones(6)), 2.0]] * calls, dev(flat), ValueError,
                         rf"out holds {6 * calls + 1} element\(s\); the calls write "
                         rf"{6 * calls}") == blocks
    assert (flat[64 * 6:] == -1.0).all()


def test_no_calls_into_an_output_array_that_holds_elements_are_refused(core):
    assert queued_blocks(core, [], dev(np.full(3, -1.0)), ValueError,
                         r"out holds 3 element\(s\); the calls write 0") == 0


def test_empty_calls_write_nothing_into_an_empty_output_array(core):
    empty = np.empty(0)
    given = dev(empty)
    outputs, result = into(core, [[dev(np.empty(0)), 2.0] for _ in range(3)], given)
    assert outputs == [] and result is given


def test_read_only_inputs_may_be_read_but_not_written_in_place(core):
    flat = np.full(8, -1.0)
    into(core, [[ReadOnly(np.ones(4)), 2.0]] * 2, dev(flat))
    np.testing.assert_array_equal(flat, np.full(8, 2.0))
    outs = [np.full(4, -1.0) for _ in range(2)]
    outputs, _, _, _ = run(core, [[ReadOnly(np.ones(4)), 3.0]] * 2, out=[dev(o) for o in outs])
    assert all((o == 3.0).all() for o in outs)
    xs = [ReadOnly(np.ones(4)) for _ in range(2)]
    refused(core, [[x, 3.0] for x in xs], ValueError, "call 0's output is read-only", out=xs)


def test_an_output_array_whose_producer_names_a_stream_is_taken(core):
    # Its stream is waited for with the inputs' (the CPU backend has none: this runs the path).
    flat = np.full(8, -1.0)
    into(core, [[dev(np.ones(4)), 2.0]] * 2, CudaArray(flat, stream=1))
    np.testing.assert_array_equal(flat, np.full(8, 2.0))


@pytest.mark.parametrize("out, error, message", [
    (np.empty(8, np.float32), TypeError, "out is float32; kernel 'device_map_scale' writes float64"),
    (np.empty(8, np.complex128), TypeError, "out has unsupported dtype"),
    ("nope", TypeError, "out must be one device array"),
    ([np.empty(4), np.empty(4)], TypeError, "out must be one device array"),
    (FakeCupyArrayWithFlag(np.ones((8, 2))[:, 0]), ValueError, "out is not C-contiguous"),
    (FakeCupyArrayWithFlag(np.ones(8), 1), ValueError,
     "call 0's part of out is on GPU 1, the call's arrays on GPU 0"),
    (ReadOnly(np.empty(8)), ValueError, "out is read-only"),
])
def test_an_output_array_that_does_not_fit_the_calls_is_refused(core, out, error, message):
    given = [dev(o) for o in out] if isinstance(out, list) else (
        dev(out) if isinstance(out, np.ndarray) else out)
    with pytest.raises(error, match=message):
        drive(start(core, [[dev(np.ones(4)), 2.0]] * 2, FakeCupyArrayWithFlag, given,
                    one_out=True), before_queue=lambda: pytest.fail("queued"), given=True)


@pytest.mark.parametrize("inputs, message", [
    # call 1 reads call 0's part
    (lambda base: [base[10:14], base[0:4]], "call 1 reads memory that call 0 writes"),
    # call 0 reads call 1's part
    (lambda base: [base[4:8], base[12:16]], "call 1 writes memory that call 0 reads"),
    # call 0 reads its own part shifted by one element
    (lambda base: [base[1:5], base[12:16]], "call 0 writes memory that it or another call reads"),
])
def test_an_output_array_over_what_other_calls_read_is_refused(core, inputs, message):
    base = np.arange(16, dtype=np.float64)
    out = base[:8]
    with pytest.raises(ValueError, match=message):
        drive(start(core, [[dev(x), 2.0] for x in inputs(base)], out=dev(out), one_out=True),
              before_queue=lambda: pytest.fail("queued"), given=True)
    np.testing.assert_array_equal(base, np.arange(16, dtype=np.float64))


def test_map_compiled_into_one_array_gives_it_as_the_result(core, numpy_buffers):
    xs = [np.arange(5, dtype=np.float64) + i for i in range(3)]
    flat = np.full(15, -1.0)
    given = dev(flat)
    done = _device.map_compiled(core, SCALE, [[dev(x), 2.0] for x in xs], _Future, out=given,
                                one_out=True)
    assert done.given and done.futures[0].result(timeout=30) is given
    assert list(done.results(None)) == []
    np.testing.assert_array_equal(flat, np.concatenate(xs) * 2.0)
    assert numpy_buffers.made == []


def test_map_into_is_refused_where_it_does_not_apply():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(TypeError, match="map_into takes a compiled kernel"):
            ex.map_into(gpupool.kernels.square, [np.ones(3)], out=np.empty(3))
        with pytest.raises(TypeError, match="map_into is for maps over device arrays"):
            ex.map_into(SCALE, [np.ones(3)], 2.0, out=np.empty(3))
        with pytest.raises(TypeError, match="device arrays need the CUDA backend"):
            ex.map_into(SCALE, [dev(np.ones(3))], 2.0, out=dev(np.empty(3)))
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.map_into(SCALE, [dev(np.ones(3))], 2.0, out=dev(np.empty(3)))


def test_out_is_refused_where_it_does_not_apply():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(TypeError, match="out is for compiled kernels"):
            ex.map(gpupool.kernels.square, [np.ones(3)], out=[np.empty(3)])
        with pytest.raises(TypeError, match="out is for compiled kernels"):
            ex.map(abs, [1.0], out=[np.empty(1)])
        with pytest.raises(TypeError, match="out is for maps over device arrays"):
            ex.map(SCALE, [np.ones(3)], 2.0, out=[np.empty(3)])



def test_a_hazard_between_calls_of_different_blocks_is_refused_after_the_earlier_blocks(core):
    # Call 100 (the second block: calls 64-191) would write what call 5 (the first) reads; the
    # first block had already been queued: by the time the map raises, each of its batches has
    # either run or been cancelled unstarted, and nothing of the second block has run.
    xs = [np.arange(4, dtype=np.float64) + i for i in range(150)]
    outs = [np.full(4, -1.0) for _ in xs]
    outs[100] = xs[5]
    launched = []
    with pytest.raises(ValueError, match="call 100 writes memory that call 5 reads"):
        drive(start(core, [[dev(x), 2.0] for x in xs], out=[dev(o) for o in outs]),
              before_queue=lambda: launched.append(1), given=True)
    assert launched == [1]  # the first block only
    for i in range(64):
        assert (outs[i] == xs[i] * 2.0).all() or (outs[i] == -1.0).all(), i
    np.testing.assert_array_equal(xs[5], np.arange(4, dtype=np.float64) + 5)
    assert all((o == -1.0).all() for o in outs[64:100] + outs[101:])


# Reading device arrays (the CUDA Array Interface, DLPack) ---------------------------------------


@pytest.mark.parametrize("typestr, name", [
    ("<f4", "float32"), ("<f8", "float64"), ("<i4", "int32"), ("<i8", "int64"),
    ("=f8", "float64"), ("|i4", "int32"), ("f4", "float32"),  # the last as NumPy reads it
])
def test_the_interfaces_type_string_gives_the_dtype(typestr, name):
    host = np.zeros((2, 3), np.dtype(name))
    address, count, dtype, ordinal, shape, stream, read = _ext.describe_device_array(
        CudaArray(host, typestr=typestr), "x")
    assert (address, count, dtype, ordinal, shape) == (host.ctypes.data, 6, name, 0, (2, 3))
    assert stream is None


@pytest.mark.parametrize("typestr, shown", [
    ("<f2", "float16"), ("<c16", "complex128"), ("|b1", "bool"), ("<u4", "uint32"),
    (">f4", ">f4"),  # another byte order: the kernels would read the bytes as this machine's
])
def test_a_type_gpupool_does_not_compute_with_is_refused(typestr, shown):
    with pytest.raises(TypeError, match=f"gpupool: x has unsupported dtype {shown}; expected "
                       "float32, float64, int32 or int64"):
        _ext.describe_device_array(CudaArray(np.zeros(4, np.float32), typestr=typestr), "x")


def test_a_type_string_numpy_cannot_read_is_refused_as_numpy_refuses_it():
    with pytest.raises(TypeError):
        _ext.describe_device_array(CudaArray(np.zeros(4), typestr="<q9"), "x")


def test_strides_must_be_those_of_a_c_contiguous_array():
    with pytest.raises(ValueError, match="x is not C-contiguous; make a contiguous copy"):
        _ext.describe_device_array(CudaArray(np.zeros((4, 4))[:, ::2]), "x")
    with pytest.raises(ValueError, match="not C-contiguous"):
        _ext.describe_device_array(CudaArray(np.zeros((3, 4)).T), "x")
    # Explicit C strides, the stride of a dimension of one, and the layout of one element or
    # none mean nothing.
    a = CudaArray(np.zeros((3, 4)))
    a.__cuda_array_interface__["strides"] = (32, 8)
    assert _ext.describe_device_array(a, "x")[1] == 12
    for host, strides in ((np.zeros((3, 1)), (8, 999)), (np.zeros((1, 1)), (5, 7)),
                          (np.zeros((0, 4)), (1, 1))):
        a = CudaArray(host)
        a.__cuda_array_interface__["strides"] = strides
        assert _ext.describe_device_array(a, "x")[1] == host.size


def test_the_producers_stream_is_noted_and_none_or_zero_is_no_stream():
    assert _ext.describe_device_array(CudaArray(np.zeros(3), stream=7), "x")[5] == 7
    assert _ext.describe_device_array(CudaArray(np.zeros(3), stream=0), "x")[5] is None
    a = CudaArray(np.zeros(3))
    del a.__cuda_array_interface__["stream"]  # before v3
    assert _ext.describe_device_array(a, "x")[5] is None


def test_a_map_takes_arrays_whose_producers_name_streams(core):
    # Each stream is waited for before each block is queued (the CPU backend has no streams to
    # wait for: this runs the path). Streams 1 and 2 are CUDA's legacy and per-thread default
    # streams, which a machine with a GPU really waits for; any other number would be taken
    # for a stream's address there.
    xs = [np.arange(4, dtype=np.float64) + i for i in range(100)]
    calls = [[CudaArray(x, stream=1 + i % 2), 2.0] for i, x in enumerate(xs)]
    outputs, futures = drive(start(core, calls, wait_streams=[0]))
    futures[0].result(timeout=30)
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 2.0)


def test_memory_that_is_not_a_gpus_is_refused(host_memory_as_device):
    _ext._take_host_memory_as_device(False)
    with pytest.raises(TypeError, match="gpupool: x claims to be on a GPU, but its memory is "
                       "unknown"):
        _ext.describe_device_array(CudaArray(np.zeros(3)), "x")
    pinned = np.frombuffer(_ext.allocate_pinned(32), np.float64)
    with pytest.raises(TypeError, match="its memory is pinned_host"):
        _ext.describe_device_array(CudaArray(pinned), "x")
    # An empty array's memory says nothing: it is on no GPU in particular.
    assert _ext.describe_device_array(CudaArray(np.zeros(0)), "x")[3] == -1


def test_objects_that_are_not_device_arrays_are_refused():
    class BrokenDLPack:
        def __dlpack_device__(self):
            raise RuntimeError("broken")

    for obj in (np.zeros(3), "x", 1.5, BrokenDLPack()):
        with pytest.raises(TypeError, match="gpupool: y is not a device array"):
            _ext.describe_device_array(obj, "y")
    for obj in (None, np.zeros(3), "x", 1.5, BrokenDLPack()):
        assert not _device.is_device_array(obj)


def test_an_array_offering_only_dlpack_needs_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    with pytest.raises(TypeError, match="gpupool: x is a DLPack device array; import cupy to "
                       "pass it"):
        _ext.describe_device_array(DLPackOnly(np.zeros(3)), "x")
    with pytest.raises(TypeError, match="import cupy"):
        _device.DeviceArray(DLPackOnly(np.zeros(3)), "x")


def test_an_array_offering_only_dlpack_is_read_through_cupys_view(core, fake_cupy):
    host = np.arange(6, dtype=np.float32)
    address, count, dtype, _, _, _, read = _ext.describe_device_array(DLPackOnly(host), "x")
    assert (address, count, dtype) == (host.ctypes.data, 6, "float32")
    assert isinstance(read, CudaArray) and read.host is host
    view = _device.DeviceArray(DLPackOnly(host), "x")
    assert view.obj.host is host and view.dtype == np.float32 and view.shape == (6,)
    xs = [np.arange(4, dtype=np.float64) + i for i in range(3)]
    outputs, futures = drive(start(core, [[DLPackOnly(x), 2.0] for x in xs]))
    futures[0].result(timeout=30)
    for x, out in zip(xs, outputs):
        np.testing.assert_array_equal(out, x * 2.0)


def test_device_array_is_the_extensions_reading():
    host = np.arange(12, dtype=np.int32).reshape(3, 4)
    view = _device.DeviceArray(CudaArray(host, stream=9), "x")
    assert (view.pointer, view.count, view.device, view.shape) == (host.ctypes.data, 12, 0, (3, 4))
    assert view.dtype == np.int32 and view.stream == 9 and view.obj.host is host
    with pytest.raises(TypeError, match="x is not a device array while the first array is"):
        _device.DeviceArray(host, "x")


# The driver: _device.map_compiled --------------------------------------------------------------


@pytest.fixture
def numpy_buffers(monkeypatch):
    """_device's buffers and views made with NumPy (CuPy's and PyTorch's need a GPU)."""
    flats = Flats()
    monkeypatch.setattr(_device, "_allocate_flat", flats)
    monkeypatch.setattr(_device, "_split_flat", np.split)
    return flats


def test_map_compiled_drives_the_run_block_by_block(core, numpy_buffers, fake_cupy):
    xs = [np.arange(i % 5, dtype=np.float64).reshape(-1, 1) + i for i in range(300)]
    calls = [[FakeCupyArray(x) if i % 2 else dev(x), 3.0] for i, x in enumerate(xs)]
    done = _device.map_compiled(core, SCALE, calls, _Future)
    assert len(numpy_buffers.made) == 3  # 64, 128, then 108 calls
    assert not done.given and len(done.futures) == 1
    for x, out in zip(xs, done.results(None)):
        assert out.shape == x.shape
        np.testing.assert_array_equal(out, x * 3.0)


def test_map_compiled_with_single_and_with_out(core, numpy_buffers):
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    one = _device.map_compiled(core, SCALE, [[dev(x), 2.0]], _Future, single=True, priority=1)
    np.testing.assert_array_equal(one.futures[0].result(timeout=30), x * 2.0)
    target = np.full(6, -1.0)
    given = [dev(target)]
    written = _device.map_compiled(core, SCALE, [[dev(x.ravel()), 2.0]], _Future, out=given)
    assert written.given and list(written.results(None)) == given
    np.testing.assert_array_equal(target, x.ravel() * 2.0)
    assert len(numpy_buffers.made) == 1  # only the single call's


def test_map_compiled_abandons_the_run_when_anything_fails(core, numpy_buffers, monkeypatch):
    # A failure in Python's part (here making the second block's buffer) stops the map as a bad
    # call does: what was queued is cancelled or waited for before the error comes out.
    def allocate(*need):
        if numpy_buffers.made:
            raise MemoryError("no room")
        return numpy_buffers(*need)

    monkeypatch.setattr(_device, "_allocate_flat", allocate)
    xs = [np.ones(3) for _ in range(100)]
    with pytest.raises(MemoryError, match="no room"):
        _device.map_compiled(core, SCALE, [[dev(x), 2.0] for x in xs], _Future)
    first = numpy_buffers.made_arrays[0]
    assert (first == 2.0).all() or (first == -1.0).all()  # ran before, or never
    monkeypatch.setattr(_device, "_allocate_flat", numpy_buffers)
    with pytest.raises(TypeError, match=r"call 70 argument 1 is not a device array"):
        _device.map_compiled(core, SCALE, [[dev(x), "two" if i == 70 else 1.0]
                                           for i, x in enumerate(xs)], _Future)


def test_a_map_into_given_outputs_that_times_out_waits_for_the_batches_that_had_started():
    # Its outputs are the caller's own arrays: batches that had started still write into them,
    # so the TimeoutError waits for them; a map's own new outputs need no such wait.
    from gpupool import _device

    steps = []

    class Task:
        def cancel(self):
            steps.append("cancel")
            return True

        def wait(self):
            steps.append("wait")

    for given, expected in ((True, ["cancel", "wait"]), (False, ["cancel"])):
        steps.clear()
        future = _Future()
        future._task = Task()
        with pytest.raises(cf.TimeoutError):
            list(_device.CompiledMap([future], [object()], given=given).results(time.monotonic()))
        assert steps == expected

