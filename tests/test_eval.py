"""mha-export eval (issue 35): exported layers inside the real model (SmolLM2-135M's GGUF, a few
layers, a short text: bounded time). Eager perplexity equals transformers' own; the fp32 export
changes nothing a model would notice; a lossy step's cost is measured and attributed; a planted
fault in one layer's artifact shows up as that layer; budgets fail with exit 1; bad input is one
line, exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import REAL_TEXT
from faults import nudge_weight
from mha_export.cli.commands import cli
from mha_export.env import openmp_wait
from mha_export.lossy.registry import attribution
from mha_export.model.eval import evaluate, kl_per_position, perplexity
from mha_export.model.report import format_evaluation
from mha_export.lossy.projections.rtn import QuantSpec

TOKENS = 48
LAYERS = "0,5"


def test_perplexity_and_kl_are_the_textbook_ones():
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([1, 4, 2, 9, 0, 3])
    nll = torch.nn.functional.cross_entropy(logits[:-1].double(), ids[1:])
    assert perplexity(logits, ids) == pytest.approx(float(torch.exp(nll)), rel=1e-12)
    assert np.allclose(kl_per_position(logits, logits), 0)
    other = logits.clone()
    other[2, 3] += 5
    kl = kl_per_position(logits, other)
    assert kl[2] > 0 and np.allclose(np.delete(kl, 2), 0)


@pytest.fixture(scope="module")
def fp32_run(smollm2_gguf, smollm2_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    return folder, evaluate(smollm2_gguf, REAL_TEXT, TOKENS, LAYERS, generate=3,
                            folder=folder, loaded=smollm2_model)


def test_eager_perplexity_equals_transformers_own(fp32_run):
    _, ev = fp32_run
    assert ev.eager_perplexity == pytest.approx(ev.transformers_perplexity, rel=1e-4)


def test_the_fp32_export_changes_nothing_the_model_notices(fp32_run):
    _, ev = fp32_run
    d = ev.to_dict()
    assert d["exported"]["top1_agreement"] >= 0.99
    assert abs(d["exported"]["ppl_increase"]) < 1e-3
    assert d["exported"]["kl_max"] < 1e-6
    assert d["generation"]["tokens"] == 3 and d["generation"]["matched"] == 3
    assert [x["layer"] for x in d["layers"]] == [0, 5]
    assert all(x["rel"] < 1e-4 for x in d["layers"])  # each artifact vs eager attention
    assert set(d) >= {"eager", "exported", "generation"} and ev.passed


def test_speed_is_timed_side_by_side_on_what_was_checked(fp32_run):
    """Prefill and cached generation, eager and exported in turn (medians): the timed decodes
    give the same greedy tokens as the checked, uncached generation; idle thread pools."""
    _, ev = fp32_run
    speed = ev.main.speed
    assert speed.thread_pool == "idle" and speed.repeats >= 3
    figures = [speed.eager_prefill, speed.exported_prefill, speed.eager_generation,
               speed.exported_generation]
    assert all(np.isfinite(f) and f > 0 for f in figures), figures
    assert speed.eager_decoded == speed.exported_decoded == ev.eager_generated
    assert ev.to_dict()["speed"]["exported_prefill"] == ev.main.tokens_per_s
    assert speed.torch_openmp and f"torch's OpenMP wait: {speed.torch_openmp}" in \
        format_evaluation(ev)


def test_a_static_cache_runs_bound_in_place_inside_the_model(smollm2_gguf, smollm2_model,
                                                             tmp_path, monkeypatch):
    """--static-cache: each layer's buffers are bound once (Runner.bind_cache, as an app steps
    them), never passed through run(); the model notices nothing and the timed cached
    generation gives the checked uncached tokens."""
    from mha_export.check.runners.ort import BoundCache, OrtRunner
    calls = []
    bound_call, plain_run = BoundCache.__call__, OrtRunner.run
    monkeypatch.setattr(BoundCache, "__call__",
                        lambda self, feeds: calls.append(feeds["x"].shape[1]) or
                        bound_call(self, feeds))
    monkeypatch.setattr(OrtRunner, "run", lambda self, feeds: pytest.fail(
        "run() on a static cache") if self.signature.static_cache else plain_run(self, feeds))
    ev = evaluate(smollm2_gguf, REAL_TEXT, TOKENS, LAYERS, generate=3, folder=tmp_path,
                  options={"static_cache": True}, loaded=smollm2_model)
    assert ev.main.kl_max < 1e-6 and ev.generation()["matched"] == 3
    assert ev.main.speed.eager_decoded == ev.main.speed.exported_decoded == ev.eager_generated
    assert TOKENS in calls and 1 in calls  # prefills and one-token steps, both bound


def test_openmp_wait_names_what_the_environment_sets():
    assert openmp_wait({"PATH": "/bin"}) == "default"
    assert openmp_wait({"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": "PASSIVE"}) == \
        "OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=1000"


def test_openmp_wait_is_what_the_process_started_with(monkeypatch):
    """The OpenMP runtime read its settings when torch loaded: a later change is not it."""
    before = openmp_wait()
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    assert openmp_wait() == before


def test_sessions_sleep_between_runs_by_default(tmp_path):
    """Many layer sessions in one process with torch beside them: no session's threads spin
    after its run unless asked (thread pool 'spin')."""
    from mha_export import MHAConfig, export_onnx
    from mha_export.artifact import read_artifact
    from mha_export.check.runners import RUNNERS, RunOptions
    art = export_onnx(MHAConfig(dim=16, heads=2), tmp_path / "a", validate=False).path
    sig = read_artifact(art).signature

    def spinning(**options) -> str:
        runner = RUNNERS["ort-cpu"].open(sig, art / "model.onnx", RunOptions(**options))
        return runner.session.get_session_options().get_session_config_entry(
            "session.intra_op.allow_spinning")
    assert spinning() == "0" and spinning(thread_pool="spin") == "1"


SHARED_POOL = """
import sys
from mha_export import MHAConfig, export_onnx
from mha_export.artifact import read_artifact
from mha_export.check.runners import RUNNERS, RunOptions
from mha_export.errors import UsageError
from mha_export.lossy.projections.rtn import QuantSpec
art = export_onnx(MHAConfig(dim=32, heads=2), sys.argv[1], quantize=QuantSpec(bits=4),
                  validate=False).path
sig = read_artifact(art).signature
RUNNERS["ort-cpu"].open(sig, art / "model.onnx", RunOptions(thread_pool="shared"))
try:
    RUNNERS["ort-cpu"].open(sig, art / "model.onnx", RunOptions(thread_pool="idle"))
except UsageError as e:
    print("refused:", e)
"""


def test_one_shared_pool_per_process_and_the_kernel_probes_join_it(tmp_path):
    """'shared' makes the process's one ONNX Runtime pool: the quantized kernels' probe sessions
    run on it (ONNX Runtime refuses own threads then), and a later session asking for its own
    pool is refused in one line (a subprocess: the pool is the whole process's)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", SHARED_POOL, str(tmp_path / "a")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "one thread policy per process" in r.stdout, r.stdout


def test_a_planted_fault_shows_up_as_its_layer(fp32_run, smollm2_gguf, smollm2_model):
    """The same exports reused, layer 5's artifact with one weight moved: the report names it."""
    folder, _ = fp32_run
    nudge_weight(folder / "exported" / "layer5" / "model.onnx", delta=0.5)
    ev = evaluate(smollm2_gguf, REAL_TEXT, TOKENS, LAYERS, generate=3, folder=folder,
                  loaded=smollm2_model)
    rel = {d.layer: d.rel for d in ev.main.details}
    assert rel[5] > 1e-3 > rel[0], rel
    assert ev.main.kl_mean > 0


def test_a_lossy_step_is_measured_and_attributed(smollm2_gguf, smollm2_model, tmp_path):
    spec = QuantSpec(bits=8, accuracy_level=4)
    ev = evaluate(smollm2_gguf, REAL_TEXT, TOKENS, "5", options={"quantize": spec},
                  attribute=True, loaded=smollm2_model, folder=tmp_path)
    steps = {r.name: r for r in ev.attribution}
    assert list(steps) == ["fp32 export", "weights int8 (fp32 compute)",
                           "weights int8 + int8 activations (level 4)"]
    assert steps["fp32 export"].kl_mean < 1e-9 < steps["weights int8 (fp32 compute)"].kl_mean
    assert ev.main.kl_mean == pytest.approx(steps[
        "weights int8 + int8 activations (level 4)"].kl_mean, rel=1e-6)


def test_lossy_steps_of_combined_options():
    spec = QuantSpec(bits=4, accuracy_level=4)
    names = [n for n, _ in attribution({"quantize": spec, "static_cache": True,
                                        "kv_cache_dtype": "int8"}, "ort-cpu")]
    assert names == ["fp32 export", "weights int4 (fp32 compute)",
                     "weights int4 + int8 activations (level 4)", "int8 cache", "all together"]


def test_cli_budgets_exit_1_and_write_json_and_plot(smollm2_gguf, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "e.json"
    args = ["eval", "--weights", str(smollm2_gguf), "--text", REAL_TEXT, "--tokens", "16",
            "--layers", "3", "--exports", str(tmp_path / "x"), "--json", str(out),
            "--plot", str(tmp_path / "kl.png"), "--quantize", "int4"]
    over = CliRunner().invoke(cli, args + ["--max-kl", "0"])
    assert over.exit_code == 1, over.output
    assert "FAIL: kl_mean" in over.output and "perplexity" in over.output
    report = json.loads(out.read_text())
    assert report["exported"]["kl_mean"] > 0 and not report["passed"]
    assert (tmp_path / "kl.png").stat().st_size > 0
    ok = CliRunner().invoke(cli, args + ["--max-kl", "10", "--min-top1", "0"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("extra, message", [
    (["--layers", "30"], "the model has 30 layers"),
    (["--tokens", "100000"], "the text has"),
    (["--max-kl", "-1"], "--max-kl must be a finite number >= 0"),
    (["--quantize", "int8", "--attribute", "--runner", "openvino-cpu"], "use --runner ort-cpu"),
    (["--thread-pool", "busy"], "Invalid value for '--thread-pool'"),
])
def test_bad_input_is_one_line_exit_2(smollm2_gguf, tmp_path, extra, message):
    result = CliRunner().invoke(cli, ["eval", "--weights", str(smollm2_gguf), "--text",
                                      REAL_TEXT, "--exports", str(tmp_path / "x"), *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command, extra, message", [
    ("capture", ["--layers", "3,31", "-o", "c.safetensors"], "--layers 31 is out of range"),
    ("capture", ["--layers", "3", "--sequences", "2", "-o", "c.safetensors"],
     "--tokens 512 x --sequences 2 needs 1024"),
    ("eval", [], "--tokens 256 needs 256"),
    ("eval", ["--layers", "40"], "the model has 30 layers"),
])
def test_what_the_header_and_the_text_tell_is_refused_before_the_model_loads(
        smollm2_gguf, tmp_path, monkeypatch, command, extra, message):
    from mha_export.model import capture, eval as evaluation, loading

    def never(*args, **kwargs):
        raise AssertionError("loaded")
    for module, name in ((loading, "load_model"), (capture, "load_model"),
                         (evaluation, "load_model"), (capture, "load_tokenizer"),
                         (loading, "load_tokenizer")):
        monkeypatch.setattr(module, name, never)
    (tmp_path / "short.txt").write_text("a short text")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [command, "--weights", str(smollm2_gguf), "--text",
                                      "short.txt", *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "--sequences" not in result.output or command == "capture"


def test_exports_must_be_this_models_exports_folder(smollm2_gguf, tmp_path):
    """Refused before the model loads, every file kept: an artifact, a folder of other files,
    another model's eval folder."""
    from mha_export.model.eval import claim_exports_folder, mark_exports_folder
    art = tmp_path / "art"
    assert CliRunner().invoke(cli, ["onnx", "--heads", "2", "--dim", "16", "-o", str(art),
                                    "--no-check"]).exit_code == 0
    other = tmp_path / "other"
    mark_exports_folder(other, tmp_path / "another-model.gguf")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("a")
    for folder, message in ((art, "not an exports folder"), (tmp_path / "mine", "not an exports"),
                            (other, "holds the layers of")):
        before = sorted(folder.iterdir())
        result = CliRunner().invoke(cli, ["eval", "--weights", str(smollm2_gguf), "--text",
                                          REAL_TEXT, "--exports", str(folder)])
        assert result.exit_code == 2 and message in result.output, result.output
        assert sorted(folder.iterdir()) == before
    ours = tmp_path / "ours"
    assert claim_exports_folder(ours, smollm2_gguf) and not ours.exists()  # nothing written yet
    mark_exports_folder(ours, smollm2_gguf)
    assert claim_exports_folder(ours, smollm2_gguf)


@pytest.mark.parametrize("command", ["eval", "capture"])
@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_gguf_is_one_line_exit_2(smollm2_gguf, tmp_path, command, damage):
    """Read by our GGUF reader before transformers' loader (whose struct.error was a 44-line
    traceback)."""
    bad = tmp_path / "bad.gguf"
    data = smollm2_gguf.read_bytes()[:3_000_000] if damage == "truncated" else b"\x00" * 100
    bad.write_bytes(data)
    extra = ["--exports", str(tmp_path / "x")] if command == "eval" else [
        "--layers", "0", "-o", str(tmp_path / "c.safetensors")]
    result = CliRunner().invoke(cli, [command, "--weights", str(bad), "--text", REAL_TEXT,
                                      *extra])
    assert result.exit_code == 2, result.output
    assert "not a readable GGUF file" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "c.safetensors").exists()


def _tiny_evaluation(saver: str, tmp_path):
    """A tiny checkpoint of tests/hybrid.py (``saver``: its function) evaluated with every
    attention layer exported, 40 tokens of text and 3 generated: (the result, as a dict)."""
    pytest.importorskip("transformers")
    import hybrid
    ckpt = getattr(hybrid, saver)(tmp_path / "ckpt")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    ev = evaluate(ckpt, text, 40, "all", generate=3, folder=tmp_path / "exports")
    d = ev.to_dict()
    assert d["exported"]["kl_max"] < 1e-6 and d["generation"]["matched"] == 3
    assert all(x["rel"] < 1e-4 for x in d["layers"])
    return ev, d


def test_a_hybrid_model_runs_with_its_attention_layers_exported(tmp_path):
    """Qwen3-Next-shaped (tiny): layers 1 and 3 exported and run by ONNX Runtime inside the
    model, the gated-delta-net layers 0 and 2 left to torch; nothing a model would notice, and
    the report says which layers were left."""
    ev, d = _tiny_evaluation("save_tiny_qwen3_next", tmp_path)
    assert [x["layer"] for x in d["layers"]] == [1, 3]
    assert d["left_to_model"] == {"0": "linear_attention", "2": "linear_attention"}
    assert "2 left to the model (linear_attention 0, 2)" in \
        format_evaluation(ev)


def test_longcat_runs_with_both_attention_modules_of_each_layer_exported(tmp_path):
    """LongCat-Flash (tiny): each layer's self_attn.0 and .1 exported (rows 0.0 ... 1.1) and run
    by ONNX Runtime inside the model, with cached generation; nothing a model would notice."""
    _, d = _tiny_evaluation("save_tiny_longcat", tmp_path)
    assert [x["layer"] for x in d["layers"]] == ["0.0", "0.1", "1.0", "1.1"]


def test_eval_device_cuda_is_refused_in_one_line_where_no_cuda_session_starts(tmp_path):
    """Before any loading: exit 2 and ONNX Runtime's own reason (here: no GPU); a runner
    without a CUDA counterpart is refused too."""
    from click.testing import CliRunner

    from mha_export.check.runners.ort import cuda_session_refusal
    from mha_export.cli.commands import cli
    if cuda_session_refusal() is None:
        pytest.skip("a CUDA session starts here")
    text = tmp_path / "t.txt"
    text.write_text("hello " * 20)
    for runner in ("ort-cpu", "torchscript"):
        r = CliRunner().invoke(cli, ["eval", "--weights", str(tmp_path / "none.gguf"), "--text",
                                     str(text), "--device", "cuda", "--runner", runner])
        assert r.exit_code == 2 and "--device cuda" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
