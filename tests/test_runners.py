"""Runners report what really ran them."""
import pytest

from mha_export import MHAConfig, export_onnx
from mha_export.signature import make_signature
from mha_export.check.runners.base import OrtRunner, RunnerUnavailable, node_placements


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


def test_real_cpu_session_log_is_understood(tmp_path, capfd):
    """ONNX Runtime 1.31's own verbose log for a CPU session: every node on the CPU provider."""
    import onnxruntime as ort
    from mha_export.check.runners.base import native_stderr
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path / "model.onnx"
    opts = ort.SessionOptions()
    opts.log_severity_level = 0
    with native_stderr() as log:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    assert list(node_placements(log["text"])) == ["CPUExecutionProvider"]


def test_cuda_runner_never_runs_on_cpu(tmp_path):
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path / "model.onnx"
    try:
        runner = OrtRunner(make_signature(MHAConfig(dim=32, heads=2)), path, "cuda")
    except RunnerUnavailable as e:
        assert "CUDAExecutionProvider" in str(e)
        return
    assert runner.providers[0] == "CUDAExecutionProvider"
