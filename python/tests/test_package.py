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
