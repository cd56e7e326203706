import pytest

from mha_export import MHAConfig

SMALL = dict(dim=64, heads=4, max_seq_len=32)


@pytest.fixture
def small_config():
    return MHAConfig(**SMALL)


def cuda_expected() -> bool:
    """Whether ONNX Runtime's CUDA runner must run here, decided without the runner under test: an
    NVIDIA GPU the driver lists, and an onnxruntime build with the CUDA provider."""
    import glob
    import onnxruntime as ort
    gpu = bool(glob.glob("/proc/driver/nvidia/gpus/*")) or bool(glob.glob("/dev/nvidia[0-9]*"))
    return gpu and "CUDAExecutionProvider" in ort.get_available_providers()
