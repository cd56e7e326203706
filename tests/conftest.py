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


# One AOTInductor package per model kind and test session (a compile takes tens of seconds),
# shared by the Python (test_aoti.py) and C++ (test_cpp.py) tests: the decode-step models, whose
# scenarios reach every dynamic axis (batch, seq, past 0 and 1).
AOTI_CONFIG = MHAConfig(dim=32, heads=2, max_seq_len=16, rotary="half")


@pytest.fixture(scope="session")
def kv_package(tmp_path_factory):
    from mha_export import export_aoti
    return export_aoti(AOTI_CONFIG, tmp_path_factory.mktemp("aoti") / "kv", kv_cache=True,
                       validate=False).path


@pytest.fixture(scope="session")
def static_package(tmp_path_factory):
    from mha_export import export_aoti
    return export_aoti(AOTI_CONFIG, tmp_path_factory.mktemp("aoti") / "static",
                       static_cache=True, validate=False).path
