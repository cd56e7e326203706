"""Which kernels a runner's row names (mha_export/check/runners/ort_kernels.py): ONNX Runtime's
CUDA debug lines read, as its 1.31 sources print them; a CPU row never names a CUDA kernel."""
import os

from mha_export.check.runners import ort_kernels as ok
from mha_export.env import captured_fd

# what ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO and ORT_FPA_INTB_DEBUG print (std::cout, coloured)
CUDA_LINES = (
    "\x1b[36mOperator=GroupQueryAttention Node=attn DataType=fp16 SdpaKernel=XQA\x1b[0m\n"
    "[fpA_intB_debug] M=1 N=6144 K=4096 nbits=4 block_size=32 device_sm=90 packing_sm=80 "
    "has_bias=0 has_zero_points=0 weight_format=runtime-prepacked(SM80 layout) "
    "kernel=GEMV(cuda) tactic=x\n"
    "Operator=MultiHeadAttention DataType=fp32 EFFICIENT_ATTENTION=1\n")


def test_cuda_debug_lines_name_the_attention_and_matmul_nbits_kernels():
    ran = ok.read_cuda_lines(CUDA_LINES, {"GroupQueryAttention", "MultiHeadAttention",
                                          "MatMulNBits"})
    assert ran.describe() == ("attention: GroupQueryAttention on XQA; attention: "
                              "MultiHeadAttention on memory-efficient; MatMulNBits: fpA_intB GEMV")


def test_no_debug_line_is_said_so_never_guessed():
    text = ok.read_cuda_lines("", {"GroupQueryAttention", "MatMulNBits"}).describe()
    assert "kernel not reported" in text and ok.NO_FPA_INTB in text
    assert ok.read_cuda_lines("", set()).describe() == "attention: decomposed (MatMul, Softmax)"


def test_a_cpu_row_names_no_cuda_kernel():
    text = ok.describe_cpu({"GroupQueryAttention", "MatMulNBits"})
    assert "CPU provider" in text
    assert not any(k in text for k in [*ok.ATTENTION_KERNELS.values(), "fpA_intB", "XQA"])


def test_the_debug_variables_are_set_and_a_users_value_kept(monkeypatch):
    monkeypatch.setenv("ORT_FPA_INTB_DEBUG", "0")
    monkeypatch.delenv("ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO", raising=False)
    ok.enable_debug_lines()
    assert os.environ["ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"] == "1"
    assert os.environ["ORT_FPA_INTB_DEBUG"] == "0"


def test_native_stdout_is_captured_not_passed_through(capfd):
    with captured_fd(1) as out:
        os.write(1, b"Operator=GroupQueryAttention DataType=bf16 SdpaKernel=FLASH_ATTENTION\n")
    assert "SdpaKernel=FLASH_ATTENTION" in out["text"] and capfd.readouterr().out == ""


def test_a_cpu_session_row_says_its_kernels(tmp_path):
    from mha_export import MHAConfig, export_onnx
    from mha_export.check.runners.ort import OrtRunner
    from mha_export.signature import make_signature
    config = MHAConfig(dim=32, heads=4, kv_heads=2)
    art = export_onnx(config, tmp_path / "a", attention="contrib-gqa", validate=False).path
    runner = OrtRunner(make_signature(config, "full"), art / "model.onnx")
    assert runner.kernels().startswith("attention: GroupQueryAttention, the CPU provider's")
