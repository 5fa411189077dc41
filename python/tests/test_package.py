"""The package as installed: stubs, version, the seed example's one-line promise."""

import inspect
import pathlib

import gpupool
from gpupool import _ext


def test_type_stubs_cover_every_public_name_of_the_extension():
    stub = (pathlib.Path(gpupool.__file__).parent / "_ext.pyi").read_text()
    assert (pathlib.Path(gpupool.__file__).parent / "py.typed").exists()
    for name, obj in vars(_ext).items():
        if name.startswith("_"):
            continue
        assert name in stub, f"_ext.pyi does not mention {name}"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member in vars(obj):
                if not member.startswith("_"):
                    assert f"def {member}" in stub, f"_ext.pyi lacks {name}.{member}"


def test_public_api_has_docstrings():
    for name in gpupool.__all__:
        obj = getattr(gpupool, name)
        if callable(obj):
            assert obj.__doc__, f"gpupool.{name} has no docstring"
    assert gpupool.__version__.count(".") == 2


def test_shipped_stubs_are_what_stubgen_makes_of_the_module(tmp_path):
    # _ext.pyi is generated at build time by nanobind's stubgen (private members included, and
    # the module's __version__ added by python/finish_stub.cmake); regenerating it from the
    # module as installed must give the same text (a hand edit, or a build that skipped the
    # step, shows here).
    import subprocess
    import sys

    import pytest

    pytest.importorskip("nanobind.stubgen")
    shipped = pathlib.Path(gpupool.__file__).parent / "_ext.pyi"
    made = tmp_path / "_ext.pyi"
    done = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-P", "-m",
                           "gpupool._ext", "-o", str(made)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert made.read_text() + "\n__version__: str\n" == shipped.read_text()


def test_errors_form_one_family_under_gpupool_error():
    # One `except gpupool.GpupoolError` catches every error of gpupool's own; each keeps the
    # standard base a caller may catch instead.
    for name in ("CudaError", "OutOfMemoryError", "BackendUnavailableError", "CompileError",
                 "DeviceFaultError"):
        assert issubclass(getattr(gpupool, name), gpupool.GpupoolError), name
    assert issubclass(gpupool.GpupoolError, RuntimeError)
    assert issubclass(gpupool.OutOfMemoryError, MemoryError)
    assert "device" in (gpupool.DeviceFaultError.__doc__ or "")


def test_gpupool_dask_without_a_working_distributed_says_what_is_installed():
    import subprocess
    import sys
    # distributed made unimportable, as one from before its dask's release fails to import.
    code = ("import sys; sys.modules['distributed'] = None\n"
            "try:\n    import gpupool.dask\n"
            "except ImportError as e:\n    print(e)\n"
            "else:\n    print('imported')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    message = done.stdout
    assert "gpupool.dask needs dask[array] and distributed of one release" in message, message
    assert 'pip install "gpupool[dask]"' in message
    here = message.split("(here: ", 1)[1]
    assert "dask" in here and "distributed" in here, message
