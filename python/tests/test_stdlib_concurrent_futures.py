"""CPython's own concurrent.futures tests (the executor, wait, as_completed and shutdown test
classes), run unchanged against gpupool.Executor through a thin adapter that maps
``max_workers`` to ``threads_per_gpu`` on the CPU backend.

Where the suite comes from, first found wins:

1. the running interpreter's own ``test.test_concurrent_futures`` (a module up to 3.11, a
   package from 3.12);
2. ``GPUPOOL_CPYTHON_FUTURES_TESTS``: the path of another CPython's ``test_concurrent_futures.py``
   (or of its package folder);
3. another CPython installed beside this one (pyenv's ``versions/*``) or the distribution's
   (``/usr/lib/python3.*``, e.g. Debian's ``libpython3.11-testsuite``), the nearest version first.

Some distributions (and some pyenv builds) leave ``test_concurrent_futures`` out of the
standard library; then 2 or 3 supplies a neighbouring version's copy, imported as it is. Without
any, the tests skip and say why (under CI, with ``CI`` set, they fail instead).

Three tests of the shutdown class are left out, because they cannot name gpupool's class: they
start a fresh, isolated interpreter (``-I``) that runs ``from concurrent.futures import
<executor class>``. Their promise (pending work at exit neither aborts nor is lost) is tested for
gpupool in test_lifecycle.py (``test_exit_with_work_pending_never_aborts``,
``test_queued_work_runs_before_exit``)."""

import importlib
import importlib.util
import os
import pathlib
import re
import sys
import unittest

import gpupool
import pytest

_MODULE_NAME = "gpupool_tests_cpython_concurrent_futures"


def _load_from(path):
    path = pathlib.Path(path)
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            _MODULE_NAME, path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


def _neighbours():
    """test_concurrent_futures of other CPythons installed beside this one, nearest first."""
    here = sys.version_info[:2]
    found = []
    versions = pathlib.Path(sys.base_prefix).parent
    # Beside pyenv's and similar side-by-side installs, the distribution's own (Debian:
    # libpython3.X-testsuite, installed by scripts/install-deps).
    libs = list(versions.glob("*/lib/python3.*")) + list(pathlib.Path("/usr/lib").glob("python3.*"))
    for lib in libs:
        match = re.fullmatch(r"python3\.(\d+)", lib.name)
        if not match:
            continue
        minor = int(match.group(1))
        for candidate in (lib / "test" / "test_concurrent_futures.py",
                          lib / "test" / "test_concurrent_futures"):
            if candidate.exists():
                found.append((abs(minor - here[1]), minor > here[1], str(candidate)))
    return [path for *_, path in sorted(found)]


def _find_suite():
    """(the suite's parts as a namespace, where it came from) or (None, why not)."""
    try:
        if importlib.util.find_spec("test.test_concurrent_futures") is not None:
            return _parts(importlib.import_module("test.test_concurrent_futures")), \
                "this interpreter's test.test_concurrent_futures"
    except ImportError:
        pass
    tried = []
    chosen = os.environ.get("GPUPOOL_CPYTHON_FUTURES_TESTS")
    for path in ([chosen] if chosen else []) + _neighbours():
        try:
            return _parts(_load_from(path)), path
        except Exception as e:  # noqa: BLE001 - a copy that does not import here: try the next
            tried.append(f"{path}: {type(e).__name__}: {e}")
    return None, ("CPython's test_concurrent_futures is not in this interpreter's standard "
                  "library, and no other copy was found or imported"
                  + (" (" + "; ".join(tried) + ")" if tried else ""))


def _parts(module):
    """The classes used below, from a module (3.11 and older) or a package (3.12 and newer)."""
    if hasattr(module, "ExecutorTest"):
        return module
    parts = type("parts", (), {})()
    for sub, names in {"util": ["BaseTestCase", "ExecutorMixin"],
                       "executor": ["ExecutorTest"], "test_wait": ["WaitTests"],
                       "test_as_completed": ["AsCompletedTests"],
                       "test_shutdown": ["ExecutorShutdownTest"]}.items():
        loaded = importlib.import_module(f"{module.__name__}.{sub}")
        for name in names:
            setattr(parts, name, getattr(loaded, name))
    return parts


_suite, _source = _find_suite()
if _suite is None:
    # CI must run these: there a missing suite is a failure, not a skip.
    if os.environ.get("CI"):
        pytest.fail(_source, pytrace=False)
    pytest.skip(_source, allow_module_level=True)


class GpupoolAdapter(gpupool.Executor):
    """gpupool.Executor spoken to as ThreadPoolExecutor(max_workers) is: ``max_workers`` lanes
    per device (the device count follows GPUPOOL_CPU_DEVICES)."""

    def __init__(self, max_workers=None, thread_name_prefix="", initializer=None, initargs=()):
        if initializer is not None:
            raise TypeError("gpupool.Executor has no initializer")
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        super().__init__(threads_per_gpu=max_workers, backend="cpu")


class GpupoolMixin(_suite.ExecutorMixin):
    executor_type = GpupoolAdapter


_NOT_NAMEABLE = ("starts an isolated interpreter that imports the executor class from "
                 "concurrent.futures; covered by test_lifecycle.py's exit tests")


class TestGpupoolExecutor(GpupoolMixin, _suite.ExecutorTest, _suite.BaseTestCase):
    pass


class TestGpupoolWait(GpupoolMixin, _suite.WaitTests, _suite.BaseTestCase):
    pass


class TestGpupoolAsCompleted(GpupoolMixin, _suite.AsCompletedTests, _suite.BaseTestCase):
    pass


class TestGpupoolShutdown(GpupoolMixin, _suite.ExecutorShutdownTest, _suite.BaseTestCase):
    for _name in ("test_interpreter_shutdown", "test_submit_after_interpreter_shutdown",
                  "test_hang_gh83386"):
        if hasattr(_suite.ExecutorShutdownTest, _name):
            locals()[_name] = unittest.skip(_NOT_NAMEABLE)(
                getattr(_suite.ExecutorShutdownTest, _name))
    del _name


def test_the_suite_was_found():
    """Says which copy ran (shown with -rA), and that it holds the classes run above."""
    assert _suite.ExecutorTest and _suite.WaitTests and _suite.AsCompletedTests
    print("CPython concurrent.futures tests from", _source)
