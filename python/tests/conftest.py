import gpupool
import pytest

_usable, _devices, _reason = gpupool.cuda_available()


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
