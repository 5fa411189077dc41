import os
import subprocess
import sys
import threading

import gpupool
import pytest

_usable, _devices, _reason = gpupool.cuda_available()

#: Set where the tests run with the extension under AddressSanitizer (scripts/python-asan): its
#: shadow memory and the quarantine of freed memory make resident sizes mean nothing.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason=f"no usable GPU: {_reason}")
    for item in items:
        if "gpu" in item.keywords and not _usable:
            item.add_marker(skip_gpu)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """Each test using it runs on the CPU backend, and on CUDA where a GPU is usable."""
    return request.param


@pytest.fixture
def executor(backend):
    with gpupool.Executor(threads_per_gpu=4, backend=backend) as ex:
        yield ex


@pytest.fixture
def hold_every_lane():
    """A function that occupies every lane of an executor with a Python task until the event it
    returns is set: ``holders, release = hold_every_lane(ex)``. (With several devices, one free
    lane would run what a test expects to stay queued.) Lanes still held at the test's end are
    released."""
    releases = []

    def hold_all(ex):
        release = threading.Event()
        started = threading.Semaphore(0)
        releases.append(release)

        def hold():
            started.release()
            release.wait(30)

        holders = [ex.submit(hold) for _ in range(ex.lane_count)]
        for _ in holders:
            assert started.acquire(timeout=10)
        return holders, release

    yield hold_all
    for release in releases:
        release.set()


def run_interrupted(code, timeout):
    """Runs `code` in a fresh interpreter; it must print "interrupted after SECONDS" once Ctrl-C
    reached it, then "ran N". Returns (SECONDS, N)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[0].startswith("interrupted after"), proc.stdout + proc.stderr
    assert lines[1].startswith("ran "), proc.stdout
    return float(lines[0].split()[-1]), int(lines[1].split()[1])
