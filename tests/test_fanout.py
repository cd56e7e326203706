"""Every layer of a checkpoint (mha_export/fanout/), on the local executor: verdicts per layer,
planted faults and dead workers as their own rows, resume, and bad input in one line."""
import functools
import json
import shutil
import time

import pytest
from click.testing import CliRunner

from conftest import FANOUT_CHECK
from faults import exit_on_layer, permute_heads
from mha_export.cli.commands import cli
from mha_export.errors import UsageError
from mha_export.fanout import check_layers, export_layers, read_summary
from mha_export.weights.source import select_layers


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def rows(summary) -> dict:
    return {r.layer: r for r in summary.records}


@pytest.mark.parametrize("spec, layers", [("all", [0, 1, 2, 3]), ("1-2", [1, 2]),
                                          ("3,0-1", [0, 1, 3]), ("2", [2])])
def test_layer_selection(spec, layers):
    assert select_layers(spec, 4) == layers


@pytest.mark.parametrize("spec", ["4", "0-4", "2-1", "a", "", "1,,x", "-1"])
def test_layer_selection_refuses_what_the_model_lacks(spec):
    with pytest.raises(UsageError):
        select_layers(spec, 4)


def test_every_layer_has_its_folder_and_verdict(smollm2_layers):
    out, summary = smollm2_layers
    assert summary.passed and summary.complete and summary.planned == 3
    written = json.loads((out / "layers.json").read_text())
    assert written["passed"] is True
    assert [r["layer"] for r in written["layers"]] == [0, 1, 2]
    for r in written["layers"]:
        assert r["status"] == "pass" and (out / r["folder"] / "model.onnx").is_file()
        assert 0 < r["worst_rel"] < 6e-5  # the fp32 rule's scaled part
        assert r["peak_mib"] > 100 and r["seconds"] > 0 and r["fingerprint"]
    assert written["executor"] == {"name": "local", "jobs": 2, "threads": 1}


def test_a_planted_fault_is_exactly_its_layer(smollm2_layers, smollm2_gguf, tmp_path):
    """check DIR fails the layer whose file was altered, passes the others, exits 1; --resume
    then exports that layer again and keeps the others."""
    out = tmp_path / "run"
    shutil.copytree(smollm2_layers[0], out)
    permute_heads(out / "layer-1" / "model.onnx", 64)
    result = run("check", out, "--seq-lens", "1,7", "--batch-sizes", "1", "--jobs", "2")
    assert result.exit_code == 1, result.output
    summary = read_summary(out)
    assert {r.layer: r.status for r in summary.records} == {0: "pass", 1: "fail", 2: "pass"}
    assert "ort-cpu y" in rows(summary)[1].message
    again = export_layers("onnx", smollm2_gguf, "0-2", out, resume=True,
                          check_options=FANOUT_CHECK)
    assert again.passed
    assert {r.layer: r.resumed for r in again.records} == {0: True, 1: False, 2: True}


def test_a_worker_that_dies_is_its_layers_crashed_row(smollm2_gguf, tmp_path):
    summary = export_layers("onnx", smollm2_gguf, "0-1", tmp_path / "run", jobs=2,
                            check_options=FANOUT_CHECK,
                            work=functools.partial(exit_on_layer, 1))
    assert summary.complete and not summary.passed
    assert rows(summary)[0].status == "pass"
    assert rows(summary)[1].status == "crashed" and "exit code 3" in rows(summary)[1].message


def test_a_layer_over_its_timeout(smollm2_gguf, tmp_path):
    summary = export_layers("onnx", smollm2_gguf, "0", tmp_path / "run", timeout=0.5)
    assert rows(summary)[0].status == "timeout"


def test_a_layer_larger_than_every_worker_is_infeasible_at_once(smollm2_gguf, tmp_path):
    start = time.perf_counter()
    result = run("onnx", "--weights", smollm2_gguf, "--layers", "0-1", "-o", tmp_path / "run",
                 "--memory-per-layer", "100000")
    assert result.exit_code == 1
    summary = read_summary(tmp_path / "run")
    assert {r.status for r in summary.records} == {"infeasible"}
    assert "100000.0 GiB on one node" in summary.records[0].message
    assert time.perf_counter() - start < 30  # said before anything ran
    assert not (tmp_path / "run" / "layer-0").exists()


@pytest.mark.parametrize("args, message", [
    (["--layers", "0-30"], "the model has 30 layers"),
    (["--layers", "x"], "expected all, A-B"),
    (["--layers", "0", "--executor", "spark"], "Invalid value for '--executor'"),
    (["--layers", "0", "--executor", "ray", "--ray-address", "127.0.0.1:1"],
     "nothing answers there"),
    (["--layers", "0", "--ray-address", "127.0.0.1:1"], "add --executor ray"),
    (["--layers", "0", "--executor", "ray", "--jobs", "2"], "--jobs is the local executor's"),
    (["--layers", "0", "--layer", "1"], "--layer and --layers"),
    (["--executor", "local"], "--executor needs --layers"),
    (["--resume"], "--resume needs --layers"),
    # what the export refuses for every layer (its request checks), never a row per layer
    (["--layers", "0-1", "--attention", "blocked", "--opset", "17"],
     "opset 17 cannot be produced for attention form 'blocked'"),
])
def test_bad_input_is_one_line_and_writes_nothing(smollm2_gguf, tmp_path, args, message):
    start = time.perf_counter()
    result = run("onnx", "--weights", smollm2_gguf, "-o", tmp_path / "run", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
    assert time.perf_counter() - start < 20  # an unreachable cluster: seconds, not minutes


def test_check_refuses_a_folder_without_layer_folders(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "layers.json").write_text('{"layers": []}')
    result = run("check", tmp_path / "run")
    assert result.exit_code == 2 and "no layer folders" in result.output


def test_only_a_layers_folder_is_ever_replaced(smollm2_gguf, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    for flags in ([], ["--force"], ["--resume"]):
        result = run("onnx", "--weights", smollm2_gguf, "--layers", "0", "-o", tmp_path / "run",
                     *flags)
        assert result.exit_code == 2 and "no layers.json" in result.output, result.output
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]


def test_force_never_deletes_a_file_the_user_put_in_a_layer_folder(tmp_path):
    """--force replaces each layer folder whole: one holding a file mha-export did not write is
    refused before any work, naming it, every file kept."""
    layer = tmp_path / "run" / "layer-0"
    layer.mkdir(parents=True)
    (tmp_path / "run" / "layers.json").write_text('{"layers": []}')
    (layer / "config.json").write_text('{"config": {}, "export": {"file": "model.onnx"}}')
    (layer / "model.onnx").write_text("x")
    (layer / "notes.txt").write_text("mine")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UsageError, match="layer-0/notes.txt, which mha-export did not write"):
        export_layers("onnx", tmp_path / "never-read.gguf", "0", tmp_path / "run", force=True)
    assert sorted(tmp_path.rglob("*")) == before and (layer / "notes.txt").read_text() == "mine"


def test_eval_reuses_a_checked_folder(smollm2_layers, smollm2_gguf, smollm2_model):
    """eval --exports DIR runs DIR's passing layers as they are (their fingerprint: the same
    weights and options), exporting nothing anew."""
    from conftest import REAL_TEXT
    from mha_export.export.fingerprint import PASSED, checked_layer
    from mha_export.fanout.records import PASS
    from mha_export.model.eval import evaluate
    out = smollm2_layers[0]
    assert PASSED == PASS  # the status eval's reuse reads is the one the fan-out writes
    from mha_export.model.eval import claim_exports_folder
    assert claim_exports_folder(out, smollm2_gguf) is False  # this model's, not eval's own
    with pytest.raises(UsageError, match="holds the layers of"):
        claim_exports_folder(out, out / "another-model.gguf")
    assert checked_layer(out, "onnx", smollm2_gguf, {}, 1) == out / "layer-1"
    assert checked_layer(out, "onnx", smollm2_gguf, {"static_cache": True}, 1) is None
    assert checked_layer(out, "torchscript", smollm2_gguf, {}, 1) is None
    result = evaluate(smollm2_gguf, REAL_TEXT, 16, "0-2", folder=out, loaded=smollm2_model)
    assert [d.artifact for d in result.main.details] == [str(out / f"layer-{i}") for i in range(3)]
    assert not (out / "exported").exists()
    assert result.main.kl_mean < 1e-6


def test_check_with_captured_inputs_gives_each_layer_its_own(smollm2_layers, smollm2_inputs,
                                                             tmp_path):
    """A capture file of several layers: each layer folder checked on its own layer's input
    (a layer the file lacks is that layer's error row, the others pass)."""
    from safetensors.numpy import load_file, save_file
    captured = load_file(str(smollm2_inputs))
    save_file({k: v for k, v in captured.items() if not k.startswith("layers.1.")},
              str(tmp_path / "some.safetensors"))
    out = tmp_path / "run"
    shutil.copytree(smollm2_layers[0], out)
    summary = check_layers(out, inputs=str(tmp_path / "some.safetensors"),
                           seq_lens=[1, 7], batch_sizes=[1], jobs=2)
    statuses = {r.layer: r.status for r in summary.records}
    assert statuses == {0: "pass", 1: "error", 2: "pass"}
    assert "layers.1" in rows(summary)[1].message or "layer 1" in rows(summary)[1].message
    assert summary.last_check["inputs"] == str(tmp_path / "some.safetensors")


def test_another_target_without_a_check_is_exported(smollm2_gguf, tmp_path):
    """torchscript --layers ... --no-check: each layer's model.pt, status exported (exit 0);
    check DIR then checks them."""
    out = tmp_path / "run"
    result = run("torchscript", "--weights", smollm2_gguf, "--layers", "4,6", "-o", out,
                 "--no-check")
    assert result.exit_code == 0, result.output
    summary = read_summary(out)
    assert {r.layer: r.status for r in summary.records} == {4: "exported", 6: "exported"}
    assert (out / "layer-6" / "model.pt").is_file()
    checked = check_layers(out, seq_lens=[1, 7], batch_sizes=[1], jobs=2)
    assert checked.passed and checked.target == "torchscript"


def test_every_layer_of_a_sharded_checkpoint_folder(tmp_path):
    """A Hugging Face folder (sharded safetensors, as large checkpoints ship): --layers all is
    its config.json's layer count, each layer read from the shards that hold it."""
    pytest.importorskip("transformers")
    from test_checkpoints import _plain
    model = _plain("llama")
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="20KB")
    summary = export_layers("onnx", tmp_path / "ckpt", "all", tmp_path / "run", jobs=2,
                            check_options=FANOUT_CHECK)
    assert summary.passed and summary.planned == model.config.num_hidden_layers
    assert sorted(r.layer for r in summary.records) == list(range(summary.planned))


def test_a_hybrid_models_other_layers_have_their_own_rows_and_the_run_passes(tmp_path):
    """Qwen3-Next-shaped: --layers all exports and checks the softmax-attention layers (1, 3);
    the gated-delta-net ones are rows of their own, and the run passes when 1 and 3 pass. A
    selection with no attention layer is one line, exit 2, before any work."""
    pytest.importorskip("transformers")
    from hybrid import save_tiny_qwen3_next
    ckpt = save_tiny_qwen3_next(tmp_path / "ckpt")
    summary = export_layers("onnx", ckpt, "all", tmp_path / "run", jobs=2,
                            check_options=FANOUT_CHECK)
    got = {r.layer: r.status for r in summary.records}
    assert got == {0: "not-attention", 1: "pass", 2: "not-attention", 3: "pass"}
    assert summary.passed and summary.planned == 4
    saved = json.loads((tmp_path / "run" / "layers.json").read_text())
    assert saved["passed"] and saved["layers"][0]["message"] == (
        "a linear_attention layer, not softmax attention: left to the model")
    assert sorted(p.name for p in (tmp_path / "run").glob("layer-*")) == ["layer-1", "layer-3"]
    checked = check_layers(tmp_path / "run", **FANOUT_CHECK)  # check DIR keeps their rows
    assert {r.layer: r.status for r in checked.records} == got and checked.passed
    resumed = export_layers("onnx", ckpt, "all", tmp_path / "run", resume=True,
                            check_options=FANOUT_CHECK)
    assert {r.layer: r.status for r in resumed.records} == got and resumed.passed
    r = run("onnx", "--weights", ckpt, "--layers", "0,2", "-o", tmp_path / "none")
    assert r.exit_code == 2 and not (tmp_path / "none").exists()
    assert r.stderr.splitlines() == ["Error: --layers 0,2: none of them is softmax attention "
                                     "(0: linear_attention, 2: linear_attention)"]


@pytest.mark.parametrize("address", ["nowhere", "host:", ":6379", "host:port"])
def test_a_malformed_ray_address_is_bad_input(address):
    from mha_export.fanout.executors.ray_tasks import probe
    with pytest.raises(UsageError, match="expected host:port"):
        probe(address)


def test_ray_address_auto_without_a_cluster_is_bad_input(monkeypatch, tmp_path):
    from mha_export.fanout.executors import ray_tasks
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_tasks, "CURRENT_CLUSTER", tmp_path / "none")
    with pytest.raises(UsageError, match="no Ray cluster runs on this machine"):
        ray_tasks.resolve_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    assert ray_tasks.resolve_address("auto") == "10.0.0.7:6379"


@pytest.mark.parametrize("args, missing", [
    (["--layers", "all"], "--layers needs --weights (a checkpoint folder or a .gguf file) and "
                          "-o DIR"),
    (["--layers", "all", "--weights", "{gguf}"], "--layers needs -o DIR"),
])
def test_layers_without_its_folders_says_what_is_missing(smollm2_gguf, args, missing):
    r = CliRunner().invoke(cli, ["onnx", *[a.format(gguf=smollm2_gguf) for a in args]])
    assert r.exit_code == 2 and missing in r.stderr, r.output
    assert ("--weights" in r.stderr) == ("--weights" in missing)


def test_an_executorch_workers_estimate_holds_its_runtime():
    """ExecuTorch's worker holds its libraries and planned memory beyond the common estimate
    (a SmolLM2 layer peaked at 1,257 MiB against 648 MiB estimated without them)."""
    from mha_export.targets.registry import TARGETS
    from mha_export.fanout.plan import estimate_bytes
    extra = estimate_bytes(4 << 20, 200 << 20, "executorch") - estimate_bytes(4 << 20,
                                                                              200 << 20)
    assert extra == TARGETS["executorch"].worker_bytes >= 600 * 2**20
    assert estimate_bytes(4 << 20, 200 << 20, "executorch") > 1257 * 2**20


def test_a_layer_nothing_here_could_check_is_unchecked_not_failed(tmp_path, monkeypatch):
    """A layer's check in which no runner under test ran is its "unchecked" row, and a run whose
    other layers passed is UNCHECKED (exit 3), not a parity failure."""
    from types import SimpleNamespace
    from conftest import BF16_CAPABLE, unavailable_here
    from mha_export import MHAConfig, check_parity, export_onnx
    from mha_export.fanout.records import LayerRecord, Summary, format_summary
    from mha_export.fanout.work import _record
    unavailable_here(monkeypatch, *BF16_CAPABLE)
    path = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "layer-1", dtype="bfloat16",
                       validate=False).path
    job = SimpleNamespace(layer=1, folder=str(path), memory=0, fingerprint="")
    record = _record(job, check_parity(path, seq_lens=[2], batch_sizes=[1]))
    assert record.status == "unchecked" and "nothing here could check it" in record.message
    summary = Summary("export", "onnx", None, {}, {}, {"name": "local"}, complete=True,
                      records=[LayerRecord(0, "pass", "layer-0"), record])
    assert summary.unchecked and not summary.passed
    assert format_summary(summary).splitlines()[-1].startswith("UNCHECKED: 2 layers")
    summary.records.append(LayerRecord(2, "fail", "layer-2"))
    assert not summary.unchecked


def test_a_worker_that_sent_its_record_exits_on_its_own(smollm2_gguf, tmp_path):
    """Killed right after its record, a worker left its libraries' semaphores to the run's
    resource tracker, which warned at exit (issue 62: 'leaked semaphore objects' after an
    ExecuTorch --layers run, whose torch.export takes tqdm's lock)."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import faults; from mha_export.fanout import export_layers; "
            f"export_layers('onnx', {str(smollm2_gguf)!r}, '0', {str(tmp_path / 'run')!r}, "
            "validate=False, work=faults.holding_a_semaphore)")
    tests = Path(__file__).parent
    done = subprocess.run([sys.executable, "-c", code], cwd=tests, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "run" / "layer-0").is_dir(), done.stderr
    assert "leaked" not in done.stderr, done.stderr
