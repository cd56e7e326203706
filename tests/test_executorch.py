"""The ExecuTorch target (export/to_executorch.py) and its executorch-cpu runner: programs
lowered to XNNPACK (or the portable kernels) pass their check with the placement said in the
row; a planted fault fails it; calls past the stated bounds are refused, never answered; what
is not built yet is one line, exit 2."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("executorch.runtime")

from mha_export import check_parity, export_executorch  # noqa: E402
from mha_export.artifact import read_artifact  # noqa: E402
from mha_export.check.runners.executorch import ExecuTorchRunner  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.config import MHAConfig  # noqa: E402
from mha_export.export import to_executorch  # noqa: E402
from mha_export.kinds.registry import build_module  # noqa: E402
from mha_export.signature import make_signature  # noqa: E402

CONFIG = dict(dim=64, heads=4, kv_heads=2, max_seq_len=16, rotary="half", qk_norm="head")
SWEEP = dict(seq_lens=[1, 5, 16], batch_sizes=[1, 3])


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    made = {}

    def get(name, **options):
        if name not in made:
            made[name] = export_executorch(MHAConfig(**CONFIG), tmp_path_factory.mktemp(name)
                                           / "art", validate=False, **options).path
        return made[name]
    return get


@pytest.mark.parametrize("call", ["full", "masked"])
def test_a_program_lowered_to_xnnpack_passes_its_check(programs, call):
    path = programs(call, attention_mask=call == "masked")
    export = read_artifact(path).export
    assert export["bounds"] == {"batch": 4, "seq": 16}
    assert export["placement"]["delegated"].get("XnnpackBackend", 0) >= 1
    report = check_parity(path, **SWEEP)
    assert report.passed
    row = next(r for r in report.runners if r.name == "executorch-cpu")
    assert "XnnpackBackend" in row.device and "portable kernels" in row.device


def test_the_portable_backend_delegates_nothing(programs):
    path = programs("portable", backend="portable")
    assert read_artifact(path).export["placement"]["delegated"] == {}
    assert check_parity(path, **SWEEP).passed


def test_a_planted_fault_fails_the_check(programs, tmp_path):
    """The program rebuilt from an output projection with one weight moved by 1e-3."""
    import shutil
    path = tmp_path / "copy"
    shutil.copytree(programs("full"), path)
    artifact = read_artifact(path)
    module = build_module(artifact.config, seed=0)
    with torch.no_grad():
        module.out_proj.weight[0, 0] += 1e-3
    to_executorch.prepare(module, artifact.config, artifact.signature).write(path / "model.pte")
    assert not check_parity(path, **SWEEP).passed


def test_calls_past_the_bounds_are_refused_and_the_sweep_stays_within(programs):
    path = programs("full")
    runner = ExecuTorchRunner(make_signature(MHAConfig(**CONFIG)), path / "model.pte")
    x = torch.zeros(5, 2, 64).numpy()
    with pytest.raises(RuntimeError, match="bounds are batch <= 4, seq <= 16"):
        runner.run({"x": x, "position_ids": torch.zeros(5, 2, dtype=torch.long).numpy()})
    report = check_parity(path, batch_sizes=[1, 8], seq_lens=[1, 17, 16])
    assert {(r.batch, r.seq) for r in report.results} == {(1, 1), (1, 16)} and report.passed


@pytest.mark.parametrize("args, msg", [
    (["--kv-cache"], "the ExecuTorch program's cache (held inside it as mutable buffers) is "
                     "not built yet"),
    (["--static-cache"], "is not built yet"),
    (["--quantize", "int4"], "--quantize for ExecuTorch (torchao's 8da4w"),
    (["--max-batch", "0"], "--max-batch must be a positive integer"),
    # DeepSeek Sparse Attention's stable top-k: ExecuTorch's edge dialect has no such operator
    (["--kv-lora-rank", "32", "--q-lora-rank", "48", "--qk-rope-head-dim", "8",
      "--index-topk", "4", "--index-heads", "8", "--index-head-dim", "16", "--max-seq-len", "16"],
     "aten.sort.stable is not in Core ATen opset"),
])
def test_what_is_not_built_is_one_line(tmp_path, args, msg):
    r = CliRunner().invoke(cli, ["executorch", "--heads", "4", "--dim", "64", *args, "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists(), r.output
    assert len(r.stderr.splitlines()) == 1 and msg in r.stderr, r.stderr
