"""Runners report what really ran them."""
import pytest

from mha_export import MHAConfig, export_onnx
from mha_export.signature import make_signature
from mha_export.check.runners import RunnerUnavailable
from mha_export.check.runners.ort import OrtRunner, _cpu_compute_nodes, node_placements
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
    warning = _cpu_compute_nodes(log)
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


def test_registry_records_and_default_selection(tmp_path):
    """Every runner's file is one an export target writes; by default a check runs every runner
    for the folder's files, and reports what each really ran on (or why it could not)."""
    from mha_export import check_parity
    from mha_export.artifact import read_artifact
    from mha_export.check.plan import selected_kinds
    from mha_export.check.runners import RUNNERS
    from mha_export.export.targets import TARGETS
    assert {k.model_file for k in RUNNERS.values()} <= {t.model_file for t in TARGETS.values()}
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path
    art = read_artifact(path)
    assert [k.name for k in selected_kinds(art, None, None)] == ["ort-cpu", "ort-cuda"]  # not openvino: named only
    assert [k.name for k in selected_kinds(art, None, ["cpu"])] == ["ort-cpu"]
    report = check_parity(path, seq_lens=[2], batch_sizes=[1])
    infos = {i.name: i for i in report.runners}
    assert infos["ort-cpu"].status == "ran" and infos["ort-cpu"].precision == "fp32"
    assert infos["ort-cuda"].status == ("ran" if cuda_expected() else "skipped")
