"""User code type-checks against the package (`mypy --strict` on a small user program), and so
does the package's own code."""

import importlib.util
import pathlib
import subprocess
import sys
import textwrap

import pytest

USER_PROGRAM = textwrap.dedent('''
    import pathlib
    from concurrent.futures import Future
    from typing import Any, Iterator, List

    import numpy as np
    import numpy.typing as npt

    import gpupool


    def squares(chunks: List[npt.NDArray[np.float64]]) -> List[npt.NDArray[Any]]:
        with gpupool.Executor(threads_per_gpu=2, backend="cpu", chunk_bytes=1 << 20) as ex:
            arrays: Iterator[npt.NDArray[Any]] = ex.map(gpupool.kernels.square, chunks)
            lengths: Iterator[int] = ex.map(len, chunks)
            first: Future[int] = ex.submit(len, chunks[0])
            squared: Future[npt.NDArray[Any]] = ex.submit(gpupool.kernels.square, chunks[0])
            print(squared.result().shape)
            total: int = first.result() + sum(lengths)
            k = gpupool.elementwise("float64 x", "float64 y", "y = x + 1")
            shifted = list(ex.map(k, chunks))
            scaled: List[npt.NDArray[Any]] = list(ex.map(gpupool.kernels.scale(2.5), chunks))
            pair: gpupool.kernels.BuiltinKernel = gpupool.kernels.axpy(2)
            by_old_name: gpupool.kernels.Kernel = gpupool.kernels.square
            print(len(scaled), pair.arity, by_old_name.arity, gpupool.kernels.add.arity)
            with ex.trace(pathlib.Path("t.json")) as t:
                out = list(arrays)
            t.write("t.json")
            print(total, len(shifted), len(t.records()))
            return out
''')


def test_user_code_passes_mypy_strict(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_PROGRAM)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "user.py"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_misspelt_kernel_name_is_flagged(tmp_path):
    """gpupool.kernels' names are made at import; its stub lets a type checker see them, so a
    typo is an error rather than Any."""
    pytest.importorskip("mypy")
    (tmp_path / "typo.py").write_text(textwrap.dedent('''
        import gpupool

        k: gpupool.kernels.BuiltinKernel = gpupool.kernels.sqaure
        f: gpupool.kernels.BuiltinKernel = gpupool.kernels.scale("2")
    '''))
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "typo.py"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("typo.py:4: error:") and '"sqaure"' in line for line in lines), \
        done.stdout
    assert any(line.startswith("typo.py:5: error:") and '"scale"' in line for line in lines), \
        done.stdout


def test_the_package_passes_mypy_strict(tmp_path):
    """The package's own code, not only code using it: every module of python/gpupool in this
    checkout (dask.py where the dask extra is installed), with the extension's stub (_ext.pyi)
    from the installed package. Imports are followed for their types, but only these modules
    are checked; each error is listed."""
    pytest.importorskip("mypy")
    package = pathlib.Path(__file__).resolve().parents[1] / "gpupool"
    files = sorted(str(path) for path in package.rglob("*.py"))
    assert str(package / "_executor.py") in files, files
    if not all(importlib.util.find_spec(extra) for extra in ("dask", "distributed")):
        files.remove(str(package / "dask.py"))
    # kernels.py is checked on its own: named on the command line it would stand for
    # gpupool.kernels in the other modules' checks, where kernels.pyi (its names, which
    # kernels.py makes at import) must.
    kernels = str(package / "kernels.py")
    files.remove(kernels)
    errors = []
    for group in (files, [kernels]):
        done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                               "--follow-imports=silent", *group],
                              capture_output=True, text=True, cwd=tmp_path)
        found = [line for line in done.stdout.splitlines() if ": error:" in line]
        if done.returncode != 0 and not found:  # mypy itself failed
            found = [done.stdout + done.stderr]
        errors += found
    assert not errors, f"{len(errors)} mypy --strict error(s):\n" + "\n".join(errors)


def test_the_benchmark_scripts_pass_mypy(tmp_path):
    """bench/*.py, at mypy's default strictness: they run only on GPU machines, where nothing
    else would notice a call that no longer fits the package (CuPy, which has no annotations,
    is imported with an ignore)."""
    pytest.importorskip("mypy")
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench"
    scripts = sorted(str(path) for path in bench.glob("*.py"))
    assert str(bench / "w5_profile.py") in scripts, scripts
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--follow-imports=silent", *scripts],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
