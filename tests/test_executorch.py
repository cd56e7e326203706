"""The ExecuTorch target (export/to_executorch.py) and its executorch-cpu runner: programs
lowered to XNNPACK (or the portable kernels) pass their check with the placement said in the
row; the static cache lives inside the program (forward moves no cache; the check reads it
back); a planted fault fails it; calls past the stated bounds are refused, never answered; what
is not built is one line, exit 2."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("executorch.runtime")

from mha_export import check_parity, export_executorch  # noqa: E402
from mha_export.artifact import read_artifact  # noqa: E402
from mha_export.check import scenarios  # noqa: E402
from mha_export.targets.executorch.runner import ExecuTorchRunner  # noqa: E402
from mha_export.check.sweep import Case  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.config import MHAConfig  # noqa: E402
from mha_export.errors import UsageError  # noqa: E402
from mha_export.targets.executorch import export as to_executorch  # noqa: E402
from mha_export.kinds.registry import build_module  # noqa: E402
from mha_export.lossy.projections.rtn import QuantSpec  # noqa: E402
from mha_export.lossy.registry import recorded  # noqa: E402
from mha_export.signature import make_signature  # noqa: E402

CONFIG = dict(dim=64, heads=4, kv_heads=2, max_seq_len=16, rotary="half", qk_norm="head")
SWEEP = dict(seq_lens=[1, 5, 16], batch_sizes=[1, 3])
STATIC_SWEEP = dict(seq_lens=[1, 5, 16])  # a static-cache program runs its rows, no other


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
    assert "XnnpackBackend" in row.device and "not delegated" in row.device


def test_the_portable_backend_delegates_nothing(programs):
    path = programs("portable", backend="portable")
    assert read_artifact(path).export["placement"]["delegated"] == {}
    assert check_parity(path, **SWEEP).passed


def test_a_planted_fault_fails_the_check(programs, tmp_path):
    """The program rebuilt from an output projection with one weight moved by 1e-3."""
    faulty = _planted(programs("full"), tmp_path, _nudge("out_proj"))
    assert not check_parity(faulty, **SWEEP).passed


def test_calls_past_the_bounds_are_refused_and_the_sweep_stays_within(programs):
    path = programs("full")
    runner = ExecuTorchRunner(make_signature(MHAConfig(**CONFIG)), path / "model.pte")
    x = torch.zeros(5, 2, 64).numpy()
    with pytest.raises(RuntimeError, match="bounds are batch <= 4, seq <= 16"):
        runner.run({"x": x, "position_ids": torch.zeros(5, 2, dtype=torch.long).numpy()})
    report = check_parity(path, batch_sizes=[1], seq_lens=[1, 16])
    assert {(r.batch, r.seq) for r in report.results} == {(1, 1), (1, 16)} and report.passed
    for asked in (dict(batch_sizes=[1, 8]), dict(seq_lens=[1, 17])):  # refused, not dropped
        with pytest.raises(UsageError, match="past the program's bounds"):
            check_parity(path, **asked)


def _nudge(projection: str) -> Callable[[torch.nn.Module], None]:
    """One weight of ``projection`` moved by 1e-3."""
    return lambda module: module.get_submodule(projection).weight[0, 0].add_(1e-3)


def _swap_value_heads(module: torch.nn.Module) -> None:
    """The value projection's rows of heads 0 and 1 swapped (the output no longer matches)."""
    h, w = module.config.head_dim, module.W_value.weight
    w[:2 * h] = torch.cat([w[h:2 * h], w[:h]])


def _planted(path, tmp_path, fault: Optional[Callable[[torch.nn.Module], None]]):
    """A copy of the program at ``path`` rebuilt (with its lossy steps) from its layer with
    ``fault`` applied (None: none)."""
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    artifact = read_artifact(copy)
    module = artifact.load_source_module()
    with torch.no_grad():
        if fault:
            fault(module)
    to_executorch.prepare(module, artifact.config, artifact.signature,
                          max_batch=artifact.export["bounds"]["batch"],
                          kernels=artifact.export.get("cache", {}).get("kernels") or "aten",
                          specs=recorded(artifact.export)).write(copy / "model.pte")
    return copy


ROWS = 3  # the static-cache programs' rows: the check's ragged batch of three rows runs


@pytest.mark.parametrize("kernels", ["aten", "llm"])
def test_the_static_cache_lives_inside_the_program_and_passes_its_check(programs, kernels):
    path = programs(f"static-{kernels}", static_cache=True, max_batch=ROWS, kernels=kernels)
    export = read_artifact(path).export
    assert export["bounds"] == {"batch": ROWS, "seq": 16, "cache": 16, "rows": ROWS}
    assert export["cache"]["methods"] == ["forward", "get_cache", "set_cache", "reset_cache"]
    assert export["cache"]["key_cache"] == [ROWS, 2, 16, 16]
    assert export["cache"]["kernels"] == kernels
    report = check_parity(path, **STATIC_SWEEP)
    assert report.passed and {r.batch for r in report.results} == {ROWS}
    row = next(r for r in report.runners if r.name == "executorch-cpu")
    assert "the cache inside the program" in row.device and f"{ROWS} static rows" in row.device
    assert {r.scenario for r in report.results if r.runner == "executorch-cpu"} >= {
        "static generate 5+1+1+1+3+1", "static ragged 7|5|3+1+1"}


@pytest.mark.parametrize("kernels", ["aten", "llm"])
def test_the_step_reads_each_buffer_where_it_lies(programs, kernels):
    """The forward method's graph: a cache buffer (or the write that returns it) feeds only its
    in-place write and the attention that reads it (a delegated bmm, or custom_sdpa): no
    slice, expand, permute or view copy of it, no write-back copy_."""
    from executorch.exir import to_edge
    from mha_export.targets.executorch import cache as executorch_cache
    path = programs(f"static-{kernels}", static_cache=True, max_batch=ROWS, kernels=kernels)
    artifact = read_artifact(path)
    module = to_executorch.without_empty_buffers(artifact.load_source_module())
    sig = artifact.signature
    bounds = {"batch": ROWS, "seq": 16, "cache": 16, "rows": ROWS}
    methods = executorch_cache.cache_methods(
        module, sig, ROWS, 16, *to_executorch._step_example(
            sig, bounds, to_executorch.EXAMPLE, {"past_key", "past_value"}, static_batch=True),
        kernels=kernels)
    program = to_executorch._lowered({"forward": methods["forward"]}, bounds, "xnnpack",
                                     to_executorch.io_names(sig))
    graph = program.to_executorch(executorch_cache.backend_config(True)) \
        .exported_program("forward").graph
    buffers = {n for n in graph.nodes
               if n.op == "placeholder" and n.name.startswith("b_cache_")}
    assert len(buffers) == 2 * ROWS
    readers = {str(u.target) for b in buffers for u in b.users}
    readers |= {str(u.target) for b in buffers for w in b.users if "index_put_" in str(w.target)
                for u in w.users}  # the in-place write returns the buffer
    allowed = ("index_put_", "executorch_call_delegate", "update_cache", "custom_sdpa",
               "getitem", "output")
    assert readers and all(any(a in r for a in allowed) for r in readers), readers


@pytest.mark.parametrize("options", [dict(sliding_window=5, softcap=30.0, sinks=True),
                                     dict(alibi=True, rotary="none", attention_chunk=4)])
def test_a_static_cache_step_with_the_layers_options_passes_its_check(tmp_path, options):
    """The ATen step's attention (grouped_attention) with the options the LLM kernels lack."""
    config = MHAConfig(**{**CONFIG, **options})
    path = export_executorch(config, tmp_path / "p", static_cache=True, max_batch=ROWS,
                             validate=False).path
    report = check_parity(path, **STATIC_SWEEP)
    assert report.passed, [r.error for r in report.results if not r.passed][:3]


def test_a_prefill_and_its_steps_move_no_cache_across_the_api(programs):
    """The runner writes the first call's buffers into the program; every later step runs on
    what the program holds (no write), and the buffers read back equal the eager module's."""
    path = programs("static-aten", static_cache=True, max_batch=ROWS, kernels="aten")
    artifact = read_artifact(path)
    runner = ExecuTorchRunner(artifact.signature, path / "model.pte")
    writes = []
    write = runner.cache.write
    runner.cache.write = type("Counted", (), {"execute": lambda _, a: writes.append(1)
                                              or write.execute(a)})()
    case = Case(3, 12, 0, "none", "static generate 5+1+1+1+3+1")
    x, mask = scenarios.scenario_inputs(artifact.config, case, 0)
    got = scenarios.generate_static(runner, x, mask, [5, 1, 1, 1, 3, 1])
    assert len(writes) == 1
    want = scenarios.eager_full(build_module(artifact.config, seed=0).eval())(x, mask)
    for name in ("y", "present_key", "present_value"):
        assert abs(got[name] - want[name]).max() < 1e-5, name


def test_a_static_cache_program_runs_one_row_by_default_and_checks_within_it(programs):
    """A static-cache program's rows default to one (an app's one stream): batch is no axis;
    the check's batch-3 cases and scenarios stay out, and asking for them is refused."""
    path = programs("one-row", static_cache=True)
    assert read_artifact(path).export["bounds"] == {"batch": 1, "seq": 16, "cache": 16,
                                                    "rows": 1}
    report = check_parity(path, seq_lens=[1, 5, 16])
    assert report.passed and {r.batch for r in report.results} == {1}
    assert "static generate 5+1+1+1+3+1" in {r.scenario for r in report.results}
    r = CliRunner().invoke(cli, ["check", str(path), "--batch-sizes", "2,3"])
    assert r.exit_code == 2 and "past the program's bounds (batch = 1," in r.stderr, r.output


def test_reset_and_write_reach_the_buffers_the_step_writes(programs):
    from executorch.runtime import Runtime
    program = Runtime.get().load_program(str(programs("static-aten", static_cache=True,
                                                      max_batch=ROWS, kernels="aten")
                                             / "model.pte"))
    write, read, reset = (program.load_method(m) for m in ("set_cache", "get_cache",
                                                           "reset_cache"))
    key, value = torch.randn(ROWS, 2, 16, 16), torch.randn(ROWS, 2, 16, 16)
    reset.execute([])
    write.execute([key, value])
    k, v = read.execute([])
    assert torch.equal(k, key) and torch.equal(v, value)
    reset.execute([])
    assert not any(t.any() for t in read.execute([]))


@pytest.mark.parametrize("kernels", ["aten", "llm"])
def test_a_planted_fault_in_the_cached_values_fails_the_check(programs, tmp_path, kernels):
    path = _planted(programs(f"static-{kernels}", static_cache=True, max_batch=ROWS,
                             kernels=kernels), tmp_path, _nudge("W_value"))
    report = check_parity(path, **STATIC_SWEEP)
    assert not report.passed
    assert any(r.output == "present_value" and not r.passed for r in report.results)


@pytest.mark.parametrize("args, msg", [
    (["--kv-cache"], "--kv-cache: a growing cache cannot live inside an ExecuTorch program"),
    (["--static-cache", "--kv-cache-dtype", "int8"], "--kv-cache-dtype int8 is ONNX-only "
                                                     "(ONNX Runtime's GroupQueryAttention and "
                                                     "standard ops); ExecuTorch exports the "
                                                     "float cache"),
    (["--kv-shared-layer", "0", "--static-cache"], "a KV-shared layer's cached call reads its "
                                                   "source layer's cache"),
    (["--quantize", "int8"], "--quantize int8 for ExecuTorch: XNNPACK takes int8 weights per "
                             "channel only"),
    (["--quantize", "int4", "--asymmetric"], "--asymmetric for ExecuTorch: XNNPACK's int4 "
                                             "kernel has no zero points"),
    (["--quantize", "int4", "--accuracy-level", "1"], "--accuracy-level 1 for ExecuTorch: "
                                                      "XNNPACK has no weight-only linear"),
    (["--quantize", "int4", "--block-size", "16"], "XNNPACK delegates int4 blocks of a "
                                                   "multiple of 32 only"),
    (["--quantize", "int4", "--backend", "portable"], "--backend portable cannot hold quantize"),
    (["--quantize", "int4", "--block-size", "128"], "q_proj has 64 input features, not whole "
                                                    "blocks of 128"),
    (["--max-batch", "0"], "--max-batch must be a positive integer"),
    (["--max-batch", "-3"], "--max-batch must be a positive integer"),
    (["--seq-lens", "2000"], "--seq-lens 2000 is past the program's bounds (batch <= 4, seq "
                             "<= 1024"),
    (["--max-batch", "1", "--batch-sizes", "1,3"], "--batch-sizes 3 is past the program's "
                                                   "bounds (batch <= 1"),
    (["--static-cache", "--batch-sizes", "2"], "--batch-sizes 2 is past the program's bounds "
                                               "(batch = 1"),
    (["--static-cache", "--kernels", "llm", "--softcap", "30"],
     "--kernels llm: ExecuTorch's custom_sdpa has no softcapping"),
    (["--static-cache", "--kernels", "llm", "--sinks"], "custom_sdpa has no attention sinks"),
    (["--kernels", "llm"], "--kernels llm: ExecuTorch's LLM kernels compute the --static-cache"),
    # DeepSeek Sparse Attention's stable top-k: ExecuTorch's edge dialect has no such operator
    (["--kv-lora-rank", "32", "--q-lora-rank", "48", "--qk-rope-head-dim", "8",
      "--index-topk", "4", "--index-heads", "8", "--index-head-dim", "16", "--max-seq-len", "16"],
     "DeepSeek Sparse Attention (--index-topk) is not built for ExecuTorch"),
])
def test_what_is_not_built_is_one_line(tmp_path, monkeypatch, args, msg):
    """Refused before anything is captured or lowered (the lowering made to fail here)."""
    monkeypatch.setattr(to_executorch, "_lowered", _never)
    r = CliRunner().invoke(cli, ["executorch", "--heads", "4", "--dim", "64", *args, "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists(), r.output
    assert len(r.stderr.splitlines()) == 1 and msg in r.stderr, r.stderr


def _never(*args, **kwargs):
    raise AssertionError("lowered: the request should have been refused before")


def test_a_folder_of_the_users_and_an_artifact_without_force_are_refused_before_lowering(
        programs, tmp_path, monkeypatch):
    artifact = programs("full")
    monkeypatch.setattr(to_executorch, "_lowered", _never)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for out, msg in ((mine, "not an mha-export artifact"),
                     (artifact, "already holds an mha-export artifact")):
        r = CliRunner().invoke(cli, ["executorch", *_cli_config(), "-o", str(out)])
        assert r.exit_code == 2 and msg in r.stderr, r.output
    assert (mine / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("name, options, args, msg", [
    ("full", {}, ["--seq-lens", "2000"], "--seq-lens 2000 is past the program's bounds"),
    ("full", {}, ["--batch-sizes", "5"], "--batch-sizes 5 is past the program's bounds"),
    ("full", {}, ["--past-lens", "5"], "--past-lens: a full-sequence call has no past"),
    ("static-aten", dict(static_cache=True, max_batch=ROWS, kernels="aten"),
     ["--past-lens", "2000", "--seq-lens", "1"], "--past-lens 2000 with --seq-lens 1 is past"),
    ("static-aten", dict(static_cache=True, max_batch=ROWS, kernels="aten"),
     ["--past-lens", "5,2000"], "--past-lens 2000 is past the program's bounds (batch = 3"),
])
def test_a_check_past_the_programs_bounds_is_one_line_not_a_traceback(programs, name,
                                                                       options, args, msg):
    """Every length asked for runs or is refused: none dropped without a word."""
    r = CliRunner().invoke(cli, ["check", str(programs(name, **options)), *args])
    assert r.exit_code == 2 and msg in r.stderr, r.output
    assert len(r.stderr.splitlines()) == 1


def test_eval_refuses_what_its_programs_cannot_hold_before_loading_the_model(
        smollm2_gguf, monkeypatch):
    from conftest import REAL_TEXT
    from mha_export.model import eval as model_eval

    def loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")
    monkeypatch.setattr(model_eval, "_model_layers_tokens", loading)
    for options, msg in (({"kv_cache": True}, "a growing cache cannot live inside"),
                         ({"static_cache": True, "quantize": QuantSpec(bits=8)},
                          "--quantize int8 for ExecuTorch")):
        with pytest.raises(UsageError, match=msg):
            model_eval.evaluate(smollm2_gguf, REAL_TEXT, 16, "5", runner="executorch-cpu",
                                options=options)


def test_a_refusal_prints_one_line_without_library_noise(tmp_path):
    """The executorch command's refusal in a fresh process: one line on stderr (no torchao
    CUDA-kernel lines, no ExecuTorch cpuinfo lines)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "mha_export", "executorch", *_cli_config(),
                        "--kv-cache", "-o", str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr


def _cli_config() -> list[str]:
    return ["--heads", "4", "--dim", "64", "--kv-heads", "2", "--max-seq-len", "16",
            "--rotary", "half", "--qk-norm", "head"]


@pytest.mark.parametrize("kernels", ["aten", "llm"])
def test_eval_runs_a_real_layer_as_its_program_with_the_cache_inside(smollm2_gguf,
                                                                     smollm2_model, tmp_path,
                                                                     kernels):
    """SmolLM2's layer 5 as an ExecuTorch program (the static cache inside it), on each kernel
    set, in the real model: the model notices nothing, and cached generation gives eager's
    tokens."""
    from conftest import REAL_TEXT
    from mha_export.model.eval import evaluate
    ev = evaluate(smollm2_gguf, REAL_TEXT, 16, "5", runner="executorch-cpu", generate=3,
                  folder=tmp_path, options={"static_cache": True, "kernels": kernels},
                  loaded=smollm2_model)
    assert ev.main.kl_max < 1e-6 and ev.generation()["matched"] == 3
    assert "the cache inside the program" in ev.main.details[0].runner
    from mha_export.model.report import format_evaluation
    assert "speed (" in format_evaluation(ev)  # no ONNX Runtime pool named: none ran
    assert "ONNX Runtime thread pool" not in format_evaluation(ev)


def test_a_planted_fault_in_a_real_layers_program_fails_its_check(smollm2_gguf, tmp_path):
    """SmolLM2's layer 5 (its Q4_1 GGUF) as a program passes its check; rebuilt with two heads'
    values swapped, it fails. (One weight moved by 1e-3 moves this layer's y by less than its
    tolerance: the real layer's output projection is small.)"""
    path = export_executorch(weights=smollm2_gguf, layer=5, output=tmp_path / "layer-5",
                             max_seq_len=16, max_batch=3, validate=False).path
    assert check_parity(path, **SWEEP).passed
    assert not check_parity(_planted(path, tmp_path, _swap_value_heads), **SWEEP).passed


@pytest.mark.parametrize("kernels", ["aten", "llm"])
def test_a_planted_fault_in_a_real_layers_static_cache_program_fails_its_check(
        smollm2_gguf, tmp_path, kernels):
    """SmolLM2's layer 5 as a static-cache program, on each kernel set, passes its check
    (prefill, steps, the ragged rows); rebuilt with two heads' values swapped, it fails."""
    path = export_executorch(weights=smollm2_gguf, layer=5, output=tmp_path / "layer-5",
                             max_seq_len=16, max_batch=ROWS, static_cache=True,
                             kernels=kernels, validate=False).path
    assert check_parity(path, **STATIC_SWEEP).passed
    faulty = check_parity(_planted(path, tmp_path, _swap_value_heads), **STATIC_SWEEP)
    assert not faulty.passed
    assert any(r.output == "present_value" and not r.passed for r in faulty.results)


def test_a_fused_projection_is_exported_split_and_keeps_its_batch_axis(tmp_path):
    """torch.export fixes the batch axis of heads split out of a fused projection's slices; the
    program is built from the split layout (the same function) and checks at batch 1 and 3."""
    config = MHAConfig(**{**CONFIG, "layout": "fused"})
    path = export_executorch(config, tmp_path / "fused", validate=False).path
    assert read_artifact(path).export["program_layout"] == "split"
    report = check_parity(path, **SWEEP)
    assert report.passed and {r.batch for r in report.results} == {1, 3}


def test_int4_projections_run_as_xnnpacks_8da4w_within_int8_activations(programs):
    """--quantize int4: the ONNX file's very blocks as torchao's int4 weights with int8
    activations, delegated to XNNPACK; the kernel's parity at the int8-activation tolerance, the
    quantizing cost reported apart, against the same dequantized reference as ONNX's."""
    from mha_export.check.runners.ort import INT8_ACTIVATION_DTYPE
    from mha_export.targets.executorch.torchao import ARITHMETIC
    path = programs("int4", quantize=QuantSpec(bits=4))
    record = read_artifact(path).export["quantize"]
    assert "8da4w" in record["format"] and record["arithmetic"] == ARITHMETIC
    assert ARITHMETIC == INT8_ACTIVATION_DTYPE  # the check's tolerance of it
    report = check_parity(path, **SWEEP)
    assert report.passed and all(q.passed for q in report.costs["quantization"])
    row = next(r for r in report.runners if r.name == "executorch-cpu")
    assert "XnnpackBackend" in row.device and ARITHMETIC in row.device
    assert (path / "model.pte").stat().st_size < (programs("full") / "model.pte").stat().st_size


def test_a_planted_fault_in_the_int4_blocks_fails_the_check(programs, tmp_path, monkeypatch):
    """The program rebuilt with each row's block scales rolled by one block (a packing bug)."""
    from mha_export.lossy.projections import rtn
    from mha_export.targets.executorch import torchao

    def rolled(weight, spec):
        q = rtn.quantize(weight, spec)
        return rtn.QuantizedWeight(spec, q.k, q.codes, np.roll(q.scales, 1, axis=1),
                                   q.zero_points)
    monkeypatch.setattr(torchao, "quantize", rolled)
    copy = _planted(programs("int4", quantize=QuantSpec(bits=4)), tmp_path, None)
    monkeypatch.undo()
    assert not check_parity(copy, **SWEEP).passed


def test_an_axis_torch_export_fixed_is_refused():
    """The guard behind the conversion: a captured program whose batch axis is a number."""
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x * 2
    program = torch.export.export(Plain(), (torch.zeros(2, 3),))
    dims = {"batch": torch.export.Dim("batch", min=1, max=4)}
    with pytest.raises(RuntimeError, match="fixed the batch axis of forward's input x"):
        to_executorch._require_dynamic("forward", program, ({0: "batch"},), dims)


def test_a_checkpoints_layers_fan_out_to_programs_with_the_cache_inside(smollm2_gguf,
                                                                        tmp_path):
    """--layers with the ExecuTorch target: each layer its own checked model.pte."""
    from conftest import FANOUT_CHECK
    from mha_export.fanout import export_layers
    summary = export_layers("executorch", smollm2_gguf, "5", tmp_path / "run",
                            check_options={**FANOUT_CHECK, "batch_sizes": [1]},
                            static_cache=True)  # the program's one static row
    assert summary.passed and (tmp_path / "run" / "layer-5" / "model.pte").is_file()
