"""Runners report what really ran them."""
import pytest

from mha_export import MHAConfig, export_onnx
from mha_export.signature import make_signature
from mha_export.check.runners import RunnerUnavailable
from mha_export.check.runners.ort import OrtRunner, cpu_compute_nodes, node_placements
from conftest import cuda_expected


def test_node_placements_parses_ort_verbose_log():
    log = """2026 [V:onnxruntime:, session_state.cc:1578 VerifyEachNodeIsAssignedToAnEp] Node placements
2026 [V:onnxruntime:, session_state.cc:1590 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 2
2026 [V:onnxruntime:, session_state.cc:1592 VerifyEachNodeIsAssignedToAnEp]   MatMul (qkv_matmul)
2026 [V:onnxruntime:, session_state.cc:1592 VerifyEachNodeIsAssignedToAnEp]   Softmax (probs)
2026 [V:onnxruntime:, session_state.cc:1590 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1
2026 [V:onnxruntime:, session_state.cc:1592 VerifyEachNodeIsAssignedToAnEp]   Shape (seq_len)
2026 [V:onnxruntime:, session_state.cc:1581 VerifyEachNodeIsAssignedToAnEp]  All nodes placed on [CUDAExecutionProvider]. Number of nodes: 7
"""
    assert node_placements(log) == {"CUDAExecutionProvider": ["MatMul (qkv_matmul)", "Softmax (probs)"],
                                    "CPUExecutionProvider": ["Shape (seq_len)"]}



def test_a_compute_node_left_on_the_cpu_is_named_with_why():
    """fp32 GroupQueryAttention has no CUDA kernel: the warning (fatal with --require-cuda)
    names the node and says what would put it on CUDA."""
    log = """2026 [V:onnxruntime:, session_state.cc:1590 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2
2026 [V:onnxruntime:, session_state.cc:1592 VerifyEachNodeIsAssignedToAnEp]   Shape (seq_len)
2026 [V:onnxruntime:, session_state.cc:1592 VerifyEachNodeIsAssignedToAnEp]   GroupQueryAttention (groupqueryattention)
"""
    warning = cpu_compute_nodes(log)
    assert warning.startswith("1 compute nodes ran on the CPU provider, not CUDA: "
                              "GroupQueryAttention (groupqueryattention)")
    assert "float16" in warning and "Shape" not in warning

def test_real_cpu_session_log_is_understood(tmp_path, capfd):
    """ONNX Runtime 1.31's own verbose log for a CPU session: every node on the CPU provider."""
    import onnxruntime as ort
    from mha_export.check.runners.ort import native_stderr
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path / "model.onnx"
    opts = ort.SessionOptions()
    opts.log_severity_level = 0
    with native_stderr() as log:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    assert list(node_placements(log["text"])) == ["CPUExecutionProvider"]


def test_cuda_runner_never_runs_on_cpu(tmp_path):
    """Decided by an independent probe (cuda_expected): with a GPU the runner must run on CUDA,
    without one it must refuse with the reason; either wrong answer fails."""
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path / "model.onnx"
    sig = make_signature(MHAConfig(dim=32, heads=2))
    if cuda_expected():
        assert OrtRunner(sig, path, "cuda").providers[0] == "CUDAExecutionProvider"
    else:
        with pytest.raises(RunnerUnavailable, match="CUDAExecutionProvider"):
            OrtRunner(sig, path, "cuda")


# what ONNX Runtime 1.31 logs when its CUDA provider's library does not load (then it falls
# back to the CPU provider); before it, preload_dlls' own lines for libraries it did not find
CUDA_NOT_LOADED_LOG = (
    "Failed to load libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file\n"
    "\x1b[1;31m2026 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] [ONNXRuntime"
    "Error] : 1 : FAIL : Failed to load library /venv/onnxruntime/capi/libonnxruntime_providers_"
    "cuda.so with error: libcublasLt.so.13: cannot open shared object file: No such file or "
    "directory\x1b[m\n")


@pytest.mark.parametrize("log, reason", [
    (CUDA_NOT_LOADED_LOG, "CUDAExecutionProvider could not load: libcublasLt.so.13: cannot open "
                          "shared object file: No such file or directory"),
    # the provider loaded (preload_dlls' lines aside): the session's own error is the reason
    (CUDA_NOT_LOADED_LOG.splitlines()[0], "CUDAExecutionProvider could not start: "
                                          "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED"),
])
def test_a_cuda_provider_that_never_loaded_is_the_reason_given(tmp_path, monkeypatch, log,
                                                               reason):
    """A bf16 file on a host whose CUDA libraries are missing: ONNX Runtime falls back to the
    CPU provider, whose missing bf16 MatMul is the error it raises; the reason given is the
    provider's load failure, read from its log, not that kernel."""
    import os
    import onnxruntime
    from mha_export.check.runners import ort

    def session(*args, **kwargs):
        os.write(2, log.encode())
        raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
                           "implementation for MatMul(13) node with name 'q_proj_matmul'")

    monkeypatch.setattr(ort, "cuda_provider_missing", lambda: None)
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: None, raising=False)
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path
    with pytest.raises(RunnerUnavailable) as e:
        ort._session(path / "model.onnx", "cuda", None)
    assert str(e.value).startswith(reason) and "\n" not in str(e.value)


def test_registry_records_and_default_selection(tmp_path):
    """Every runner's file is one an export target writes; by default a check runs every runner
    for the folder's files, and reports what each really ran on (or why it could not)."""
    from mha_export import check_parity
    from mha_export.artifact import read_artifact
    from mha_export.check.plan import selected_kinds
    from mha_export.check.runners import RUNNERS
    from mha_export.targets.registry import TARGETS
    assert {k.model_file for k in RUNNERS.values()} <= {t.model_file for t in TARGETS.values()}
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path
    art = read_artifact(path)
    assert [k.name for k in selected_kinds(art, None, None)] == ["ort-cpu", "ort-cuda"]  # not openvino: named only
    assert [k.name for k in selected_kinds(art, None, ["cpu"])] == ["ort-cpu"]
    report = check_parity(path, seq_lens=[2], batch_sizes=[1])
    infos = {i.name: i for i in report.runners}
    assert infos["ort-cpu"].status == "ran" and infos["ort-cpu"].precision == "fp32"
    assert infos["ort-cuda"].status == ("ran" if cuda_expected() else "skipped")


def test_ort_cpu_skips_a_bfloat16_model_with_its_reason(tmp_path):
    """ONNX Runtime's CPU provider has no bf16 MatMul: ort-cpu is SKIPPED in one line naming
    the op and where to check instead, never a crash, never a pass (nothing else ran here)."""
    from mha_export import check_parity
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", dtype="bfloat16",
                       validate=False).path
    with pytest.raises(RunnerUnavailable, match=r"no bfloat16 kernel for MatMul\(13\)") as e:
        OrtRunner(make_signature(MHAConfig(dim=32, heads=2)), path / "model.onnx")
    assert "\n" not in str(e.value) and "openvino-cpu" in str(e.value)
    report = check_parity(path, providers=["cpu"], seq_lens=[2], batch_sizes=[1])
    info = next(i for i in report.runners if i.name == "ort-cpu")
    assert info.status == "skipped" and "bfloat16" in info.reason
    assert not report.tested and not report.passed


def test_bfloat16_crosses_onnx_runtime_as_ortvalues():
    """numpy has no bfloat16 and ONNX Runtime 1.31's run() takes no ml_dtypes array: inputs go
    in as OrtValues over their bits and outputs are read back from theirs (an Identity: the one
    bf16 kernel this test needs on CPU)."""
    import ml_dtypes
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from mha_export.check.runners.ort import InPlaceCall, widened
    from mha_export.signature import Signature, TensorSpec
    bf16 = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [bf16("x", TensorProto.BFLOAT16, ["b", 3])],
                              [bf16("y", TensorProto.BFLOAT16, ["b", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1.5, -2.25, 3e38]], np.float32).astype(ml_dtypes.bfloat16)
    sig = Signature("full", (TensorSpec("x", "float", ("b", 3)),),
                    (TensorSpec("y", "float", ("b", 3)),))
    (y,) = InPlaceCall(session, sig, {"x": x}, in_place=False).run()
    assert y.dtype == ml_dtypes.bfloat16 and np.array_equal(y, x)
    assert widened(y).dtype == np.float32


def test_half_precision_models_get_their_tolerance_on_every_onnx_runner():
    from mha_export.comparison.comparator import BFLOAT16, FLOAT16
    from mha_export.check.runners import RUNNERS, RunOptions
    for name in ("ort-cpu", "ort-cuda", "openvino-cpu"):
        tolerance = RUNNERS[name].tolerance
        assert tolerance("bfloat16", RunOptions()) == BFLOAT16
        assert tolerance("float16", RunOptions()) == FLOAT16


def test_a_runtimes_info_lines_are_dropped_and_its_errors_kept(capfd):
    """ExecuTorch's runtime prints thread-pool info lines to stderr, from C++ and through
    Python's sys.stderr (issue 62); what else is written meanwhile reaches stderr."""
    import os
    import sys
    from mha_export.targets.executorch import RUNTIME_INFO as EXECUTORCH_INFO
    from mha_export.env import native_stderr_without
    with native_stderr_without(EXECUTORCH_INFO):
        os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file /sys/x\n"
                    b"[method.cpp:12] a real error\n")
        sys.stderr.write("[threadpool.cpp:66] Resetting threadpool to 1 threads.\n")
        sys.stderr.write("a Python error\n")
    assert capfd.readouterr().err == "[method.cpp:12] a real error\na Python error\n"


def test_a_cuda_session_runs_on_the_stream_it_is_given(tmp_path, monkeypatch):
    """The bench's CUDA events bracket a call's work only if its session runs on the bench's
    stream: ONNX Runtime's user_compute_stream as the Python API takes it (the address as a
    string), beside the graph option; without one, no stream is named (ONNX Runtime's own)."""
    import onnxruntime
    from mha_export.check.runners import ort
    asked = []

    def session(model, options, providers):
        asked.append(providers[0][1])
        raise RuntimeError("no GPU in this test")

    monkeypatch.setattr(ort, "cuda_provider_missing", lambda: None)
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: None, raising=False)
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path
    for settings in (ort.CudaSettings(graph=True, compute_stream=0x7F00AB), ort.CudaSettings()):
        with pytest.raises(RunnerUnavailable):
            ort._session(path / "model.onnx", "cuda", None, settings)
    assert asked == [{"use_tf32": "1", "enable_cuda_graph": "1",
                      "user_compute_stream": str(0x7F00AB)},
                     {"use_tf32": "1", "enable_cuda_graph": "0"}]
