import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from mha_export.cli.commands import cli

import faults
from conftest import BF16_CAPABLE, unavailable_here

SMALL = ["--heads", "4", "--dim", "64", "--max-seq-len", "16"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("Error: ")
    return lines[-1]


@pytest.mark.parametrize("command", [[], ["onnx"], ["torchscript"], ["check"]])
def test_help_with_examples(command):
    r = run(*command, "--help")
    assert r.exit_code == 0
    assert "mha-export" in r.output


def test_help_names_every_export_target():
    from mha_export.targets.registry import TARGETS
    summary = run("--help").output.split("\n\n")[1].lower()
    assert all(name in summary for name in TARGETS), summary


def test_export_then_check(tmp_path):
    out = tmp_path / "art"
    r = run("onnx", *SMALL, "-o", out)
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output and "ort-cpu" in r.output
    assert "SKIPPED" in r.output or "CUDAExecutionProvider" in r.output
    r = run("check", out, "--providers", "cpu", "--seq-lens", "1,3,17", "--json", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["passed"] and report["seq_lens"] == [1, 3, 17]


def test_parity_failure_exits_1(tmp_path):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    faults.remove_causal_mask(out / "model.onnx")
    r = run("check", out, "--providers", "cpu")
    assert r.exit_code == 1
    assert "FAIL" in r.output


def test_require_cuda_without_gpu_exits_1(tmp_path):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    r = run("check", out, "--require-cuda", "--seq-lens", "2")
    from conftest import cuda_expected
    assert r.exit_code == (0 if cuda_expected() else 1)


@pytest.mark.parametrize("args, msg", [
    (["onnx", "--heads", "7", "--dim", "768"], "not divisible"),
    (["onnx", "--heads", "0"], "heads must be a positive integer"),
    (["onnx", "--heads", "x"], "not a valid integer"),
    (["onnx", "--layout", "diagonal"], "is not one of"),
    (["onnx", *SMALL, "--opset", "9"], "opset 9 cannot be produced"),
    (["onnx", *SMALL, "--attention", "attention-op", "--opset", "18"], "opset 18 cannot be produced"),
    (["onnx", *SMALL, "--weights", "/nonexistent/w.pt"], "weights file not found"),
    (["check", "/nonexistent"], "artifact folder not found"),
    (["check", ".", "--seq-lens", "0,4"], "expected integers >= 1"),
    (["check", ".", "--past-lens", "-1"], "expected integers >= 0"),
    (["check", ".", "--providers", "tpu"], "choose from cpu, cuda"),
])
def test_bad_input_exits_2(tmp_path, monkeypatch, args, msg):
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    assert msg in one_line_error(r)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_unwritable_output(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "file").write_text("x")
    r = run("onnx", *SMALL, "-o", ro / "file" / "art")
    one_line_error(r)


def test_corrupt_artifact_and_weights(tmp_path):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    (out / "model.onnx").write_bytes(b"garbage")
    assert "cannot load" in one_line_error(run("check", out))
    (out / "config.json").write_text("{not json")
    assert "corrupt artifact config" in one_line_error(run("check", out))
    (tmp_path / "w.safetensors").write_bytes(b"junk")
    assert "not a readable safetensors" in one_line_error(
        run("onnx", *SMALL, "--weights", tmp_path / "w.safetensors", "-o", tmp_path / "o2"))
    assert not (tmp_path / "o2").exists()


def test_wrong_shaped_weights(tmp_path):
    from mha_export import MHAConfig, build_module
    from mha_export.weights.files import save_weights
    save_weights(build_module(MHAConfig(dim=32, heads=4), seed=0), tmp_path / "w.safetensors")
    msg = one_line_error(run("onnx", *SMALL, "--weights", tmp_path / "w.safetensors", "-o", tmp_path / "o"))
    assert "W_query.weight has shape [32, 32]" in msg


def test_existing_artifact_needs_force(tmp_path):
    out = tmp_path / "art"
    assert run("torchscript", *SMALL, "-o", out, "--no-check").exit_code == 0
    assert "--force" in one_line_error(run("torchscript", *SMALL, "-o", out))
    assert run("torchscript", *SMALL, "-o", out, "--no-check", "--force").exit_code == 0


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("users", [
    {"src/main.py": "code", "notes.md": "notes"},  # a project folder
    {"config.json": '{"model_type": "llama"}', "model.safetensors": "x"},  # a checkpoint
    {"config.json": "not json", "model.onnx": "x"},  # looks like an artifact, is not one
])
def test_force_never_replaces_a_folder_mha_export_did_not_write(tmp_path, users):
    out = tmp_path / "proj"
    for name, text in users.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = _files(out)
    for flags in ([], ["--force"]):
        msg = one_line_error(run("onnx", *SMALL, "-o", out, "--no-check", *flags))
        assert "not an mha-export artifact" in msg and "kept" in msg
    assert _files(out) == before and (out / next(iter(users))).read_text() == next(iter(users.values()))


@pytest.mark.parametrize("users", [{"notes.txt": "mine"}, {"runs/1.log": "log"},
                                   {"a.txt": "1", "b.txt": "2", "c.txt": "3", "d.txt": "4"}])
def test_force_over_an_artifact_never_deletes_a_file_mha_export_did_not_write(tmp_path, users):
    """Refused in one line naming the file (with or without --force), every file kept; once
    it is moved, --force replaces the artifact's own files (the report and eval's record
    included)."""
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--sweep", "quick").exit_code == 0  # + parity.json
    (out / "eval-options.json").write_text("{}")  # eval's record: written by mha-export
    assert run("check", out, "--sweep", "quick", "--json", out / "ci.json").exit_code == 0
    (out / "ci.json.txt").write_text((out / "ci.json").read_text())  # only .json is read
    for name, text in users.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = {f: (out / f).read_bytes() for f in _files(out) if (out / f).is_file()}
    for flags in ([], ["--force"]):
        msg = one_line_error(run("torchscript", *SMALL, "-o", out, "--no-check", *flags))
        assert "which mha-export did not write" in msg, msg
        assert sorted(users)[0].split("/")[0] in msg and "ci.json," not in msg
        assert ("and 2 more" in msg) if len(users) == 4 else ("ci.json.txt" in msg)
    assert {f: (out / f).read_bytes() for f in _files(out) if (out / f).is_file()} == before
    for name in [*users, "ci.json.txt"]:
        (out / name).unlink()
    shutil.rmtree(out / "runs", ignore_errors=True)
    assert run("torchscript", *SMALL, "-o", out, "--no-check", "--force").exit_code == 0
    assert _files(out) == ["config.json", "model.pt", "weights.safetensors"]


def test_force_replaces_an_artifact_and_a_layers_folder_is_one_of_ours(tmp_path):
    from mha_export.artifact import made_by_us
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    assert made_by_us(out) == "artifact"
    assert run("torchscript", *SMALL, "-o", out, "--no-check", "--force").exit_code == 0
    assert (out / "model.pt").is_file() and not (out / "model.onnx").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "layers.json").write_text("{}")  # a name alone is no proof
    assert made_by_us(tmp_path / "run") is None
    (tmp_path / "run" / "layers.json").write_text('{"layers": []}')
    assert made_by_us(tmp_path / "run") == "layers" and made_by_us(tmp_path) is None


def test_the_working_folder_is_an_answer_only_when_empty_or_an_artifact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run("onnx", *SMALL, "-o", ".", "--no-check").exit_code == 0  # empty: written in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.onnx",
                                                          "weights.safetensors"]
    assert "--force" in one_line_error(run("onnx", *SMALL, "-o", ".", "--no-check"))
    assert run("torchscript", *SMALL, "-o", ".", "--no-check", "--force").exit_code == 0
    assert (tmp_path / "model.pt").is_file() and not (tmp_path / "model.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.pt",
                                                          "weights.safetensors"]  # no staging left
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # inside the artifact it would replace
    assert "working folder is inside" in one_line_error(
        run("onnx", *SMALL, "-o", "..", "--no-check", "--force"))
    (tmp_path / "sub").rmdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "mine.txt").write_text("mine")
    assert "kept" in one_line_error(run("onnx", *SMALL, "-o", ".", "--no-check", "--force"))
    assert (tmp_path / "mine.txt").read_text() == "mine"


def test_an_output_under_a_file_names_the_file(tmp_path):
    (tmp_path / "f").write_text("x")
    msg = one_line_error(run("onnx", *SMALL, "-o", tmp_path / "f" / "sub", "--no-check"))
    assert f"{tmp_path / 'f'} is a file" in msg


@pytest.mark.parametrize("stage, target", [("prepare", "building the ONNX graph"),
                                            ("write", "writing model.onnx")])
def test_a_library_failure_inside_an_export_is_one_line_naming_its_stage(tmp_path, monkeypatch,
                                                                      stage, target):
    from mha_export.targets import registry as targets
    from mha_export.targets.base import Prepared

    def broken(*args, **kwargs):
        if stage == "prepare":
            raise RuntimeError("kernel exploded\nsecond line")
        return Prepared({}, lambda path: (_ for _ in ()).throw(ValueError("disk on fire")))

    monkeypatch.setitem(targets.TARGETS, "onnx", dataclasses.replace(
        targets.TARGETS["onnx"], prepare=broken))
    msg = one_line_error(run("onnx", *SMALL, "-o", tmp_path / "o", "--no-check"))
    assert f"onnx export of split-h4-d64: {target} failed" in msg and "-v" in msg
    assert not (tmp_path / "o").exists()
    verbose = run("onnx", *SMALL, "-o", tmp_path / "o", "--no-check", "-v")
    assert verbose.exit_code == 2 and "Traceback" in verbose.stderr


def test_an_export_shows_its_checks_progress(tmp_path, monkeypatch):
    """The check at export reports each case as `check` does (on a terminal only)."""
    from mha_export.cli import commands
    seen = []
    monkeypatch.setattr(commands, "_progress", lambda i, n, label: seen.append((i, n)))
    assert run("onnx", *SMALL, "--kv-cache", "-o", tmp_path / "o").exit_code == 0
    assert seen and seen[0][0] == 0 and seen[-1][0] == seen[-1][1] > 20


def test_a_usage_error_through_the_console_script_is_one_line():
    done = subprocess.run([sys.executable, "-m", "mha_export", "onnx", "--quantize", "int3"],
                          capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: ")
    assert "'int3' is not one of" in lines[0] and "onnx --help)" in lines[0]


def test_messages_say_what_is_wrong(tmp_path):
    from mha_export.lossy.base import verdict
    assert verdict(False, 0.0001, "--max-clip-rate", percent=True) == "FAIL (budget 0.010%)"
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_text("x")
    msg = one_line_error(run("onnx", "--weights", tmp_path / "ck", "--layer", "0", "-o",
                             tmp_path / "o", "--no-check"))
    assert "a folder without a Hugging Face config.json" in msg


def test_an_exports_check_is_narrowed_by_the_sweep_options(tmp_path):
    out = tmp_path / "o"
    assert run("onnx", *SMALL, "--kv-cache", "--seq-lens", "1,3", "--batch-sizes", "1",
               "--past-lens", "0,2", "-o", out).exit_code == 0
    report = json.loads((out / "parity.json").read_text())
    assert (report["seq_lens"], report["batch_sizes"], report["past_lens"]) == ([1, 3], [1],
                                                                               [0, 2])
    assert "--no-check" in one_line_error(run("onnx", *SMALL, "--seq-lens", "1", "--no-check",
                                              "-o", tmp_path / "n"))


def test_an_export_checks_the_quick_sweep_and_check_the_full_one(tmp_path):
    out = tmp_path / "o"
    r = run("onnx", *SMALL, "--kv-cache", "--seq-lens", "1,65", "-o", out)
    assert r.exit_code == 0 and "the quick sweep" in r.output
    quick = json.loads((out / "parity.json").read_text())
    assert run("check", out, "--seq-lens", "1,65", "--json", tmp_path / "f.json").exit_code == 0
    full = json.loads((tmp_path / "f.json").read_text())
    assert (quick["sweep"], full["sweep"]) == ("quick", "full")
    assert len(quick["results"]) < len(full["results"])
    assert run("onnx", *SMALL, "--kv-cache", "--seq-lens", "1,65", "--sweep", "full", "-o", out,
               "--force").exit_code == 0
    assert json.loads((out / "parity.json").read_text())["sweep"] == "full"
    assert "--no-check" in one_line_error(run("onnx", *SMALL, "--sweep", "full", "--no-check",
                                              "-o", tmp_path / "n"))


def test_console_script_is_quiet_and_clean(tmp_path):
    """Through the real entry point: no exporter chatter, no traceback, exit codes as documented."""
    exe = [sys.executable, "-m", "mha_export"]
    ok = subprocess.run([*exe, "torchscript", *SMALL, "-o", tmp_path / "ts"], capture_output=True, text=True)
    # torch.jit's deprecation is surfaced, as one note; nothing else is printed on stderr
    assert ok.returncode == 0 and ok.stderr.splitlines() == [
        "note: torch 2.13 deprecates torch.jit (TorchScript); `mha-export aoti` writes its "
        "successor (torch.export + AOTInductor)"], ok.stderr
    bad = subprocess.run([*exe, "onnx", "--heads", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr


def test_check_summary_is_short_and_verbose_has_every_row(tmp_path):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    r = run("check", out, "--json", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) <= 20, r.output
    assert lines[0].split()[:2] == ["runner", "output"] and lines[-1].startswith("PASS")
    rows = json.loads((tmp_path / "p.json").read_text())["results"]
    assert len(rows) > 20  # every (runner, case, output) is in the JSON ...
    verbose = run("check", out, "-v").output.strip().splitlines()
    assert len(verbose) >= len(rows) + len(lines)  # ... and printed with -v


@pytest.mark.parametrize("args, message", [
    (["--thread-pool", "spin"], "--runner torchscript opens no ONNX Runtime session"),
    (["--attention", "blocked"], "--attention is the ONNX file's graph form: --runner "
                                 "torchscript runs model.pt"),
])
def test_eval_options_its_runner_would_not_use_are_refused(tmp_path, args, message):
    """--thread-pool was ignored by a runner without ONNX Runtime; --attention was refused as
    'config has unknown fields'."""
    r = run("eval", "--weights", tmp_path, "--text", tmp_path / "t.txt", "--runner",
            "torchscript", *args)
    assert message in one_line_error(r)


@pytest.mark.parametrize("command", [["check", "{run}"], ["onnx", "--layers", "all", "--weights",
                                                          "{run}", "-o", "{run}/out"]])
def test_verbose_with_a_layers_folder_is_refused_in_one_line(tmp_path, command):
    """-v shows one process's warnings and check rows; a layers folder's layers run in
    workers of their own (it was accepted and ignored)."""
    (tmp_path / "run" / "layer-0").mkdir(parents=True)
    (tmp_path / "run" / "layers.json").write_text('{"layers": []}')
    r = run(*[a.format(run=tmp_path / "run") for a in command], "-v")
    assert "layer-N/parity.json" in one_line_error(r)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["layer-0", "layers.json"]


def test_a_failure_names_the_worst_case_and_element(tmp_path):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    faults.nudge_weight(out / "model.onnx", delta=1e-2)  # 1e-3 is 7e-5 of max|y| at T <= 9
    r = run("check", out, "--providers", "cpu", "--seq-lens", "3,9")
    assert r.exit_code == 1
    fail = [l for l in r.output.splitlines() if l.startswith("FAIL ort-cpu y")]
    assert fail and "worst at (" in fail[0] and "B=" in fail[0]


@pytest.mark.parametrize("args, msg", [
    (["--atol", "-1"], "atol must be a finite number >= 0"),
    (["--rtol", "nan"], "rtol must be a finite number >= 0"),
    (["--batch-sizes", "100000", "--seq-lens", "100000"], "needs about"),
])
def test_check_refuses_bad_tolerances_and_sweeps_that_cannot_fit(tmp_path, args, msg):
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    assert msg in one_line_error(run("check", out, *args))


def test_kv_cache_export_and_check(tmp_path):
    out = tmp_path / "kv"
    r = run("onnx", *SMALL, "--kv-cache", "-o", out)
    assert r.exit_code == 0, r.output
    for name in ("y", "present_key", "present_value"):
        assert any(l.split()[:2] == ["ort-cpu", name] and l.endswith("PASS")
                   for l in r.output.splitlines()), r.output
    r = run("check", out, "--providers", "cpu", "--past-lens", "0,3", "--seq-lens", "1,4")
    assert r.exit_code == 0, r.output


def test_the_form_renamed_in_0_2_is_refused_since_0_3(tmp_path):
    r = CliRunner().invoke(cli, ["onnx", *SMALL, "--attention", "fused", "-o", str(tmp_path / "a"),
                                 "--no-check"])
    assert r.exit_code == 2 and "'fused' is not one of" in r.stderr
    assert not (tmp_path / "a").exists()


def test_grouped_query_export_and_a_form_that_cannot(tmp_path):
    r = run("onnx", *SMALL, "--kv-heads", "2", "--kv-cache", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    assert cfg["config"]["kv_heads"] == 2
    assert cfg["io"]["inputs"][2]["shape"] == ["batch", 2, "past_seq", 16]
    msg = one_line_error(run("onnx", *SMALL, "--kv-heads", "2", "--attention", "contrib-mha",
                             "-o", tmp_path / "m"))
    assert "does not support gqa" in msg and "forms that can: auto" in msg
    assert "multiple of kv_heads" in one_line_error(run("onnx", *SMALL, "--kv-heads", "3"))


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_export_cleans_up_and_never_reads_as_a_verdict(tmp_path, signum, code):
    """SIGTERM (timeout, CI, container stops) and Ctrl-C while the export is staged: the staging
    folder is removed and the exit code says interrupted (143 / 130), not 'parity failure' (1)."""
    proc = subprocess.Popen([sys.executable, "-m", "mha_export", "onnx", "--heads", "12",
                             "--dim", "768", "-o", str(tmp_path / "x")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".x.*.tmp")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the export never staged its folder"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the export or its parity check
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_interruption_a_runtime_swallowed_still_ends_the_run(tmp_path, monkeypatch):
    """Ctrl-C during ONNX Runtime's session creation comes back as 'initialization failed'
    (seen under load: exit 2 'cannot load', or a CUDA runner SKIPPED and exit 0). Once the
    signal was received, that error unwinds as the interruption and nothing is published."""
    from mha_export import errors
    from mha_export.artifact import read_artifact, staged_folder
    from mha_export.check.plan import _open
    from mha_export.check.runners import RUNNERS, RunOptions
    art = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", art, "--no-check").exit_code == 0
    monkeypatch.setattr(errors, "_received", [signal.SIGINT])

    def swallowed(*args):
        raise RuntimeError("initialization failed")

    kind = dataclasses.replace(RUNNERS["ort-cpu"], open=swallowed)
    with pytest.raises(errors.Interrupted):
        _open(kind, read_artifact(art), RunOptions())
    with pytest.raises(errors.Interrupted):
        with staged_folder(tmp_path / "never", force=False) as stage:
            (stage / "model.onnx").write_text("complete, but interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_bench_plot_without_matplotlib_is_refused_before_any_work(tmp_path, monkeypatch):
    import mha_export.bench.driver as driver
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(driver, "run_bench", lambda *a, **k: pytest.fail("measured first"))
    r = CliRunner().invoke(cli, ["bench", *SMALL, "--plot", str(tmp_path / "b.png")])
    assert r.exit_code == 2, r.output
    assert "pip install 'mha-export[plot]'" in one_line_error(r)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, flag", [
    (["bench", *SMALL], "--json"), (["bench", *SMALL], "--plot"),
    (["check", "models/nowhere"], "--json"),
    (["eval", "--weights", "nowhere.gguf", "--text", "nowhere.txt"], "--json"),
    (["eval", "--weights", "nowhere.gguf", "--text", "nowhere.txt"], "--plot")])
def test_an_output_files_folder_is_checked_before_any_work(tmp_path, monkeypatch, command,
                                                           flag):
    """performance.md's `--json benchmarks/results/...` run outside the repository measured
    for minutes, then failed to write: the folder is refused first, in one line."""
    import mha_export.bench.driver as driver
    monkeypatch.setattr(driver, "run_bench", lambda *a, **k: pytest.fail("measured first"))
    missing = tmp_path / "benchmarks" / "results"
    line = one_line_error(run(*command, flag, missing / "out.json"))
    assert f"folder {missing} not found" in line and flag in line, line
    assert list(tmp_path.iterdir()) == []


def test_check_selects_runners_by_name(tmp_path):
    out = tmp_path / "ts"
    assert run("torchscript", *SMALL, "-o", out, "--no-check").exit_code == 0
    r = run("check", out, "--runners", "torchscript", "--seq-lens", "3")
    assert r.exit_code == 0 and "torchscript" in r.output, r.output
    assert "does not hold" in one_line_error(run("check", out, "--runners", "ort-cpu"))
    assert "choose from" in one_line_error(run("check", out, "--runners", "tvm"))
    assert "no CUDA runner" in one_line_error(run("check", out, "--require-cuda"))


def test_dtype_bfloat16_is_accepted_and_what_it_cannot_build_is_one_line(tmp_path):
    r = run("onnx", *SMALL, "--dtype", "bfloat16", "--no-check", "-o", tmp_path / "bf16")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["export"]["dtype"] \
        == "bfloat16"
    line = one_line_error(run("onnx", *SMALL, "--dtype", "bfloat16", "--static-cache",
                              "--kv-cache-dtype", "int8", "-o", tmp_path / "int8"))
    assert "float32" in line and "bfloat16" in line


BF16_EXPORT = ["onnx", *SMALL, "--kv-heads", "2", "--rotary", "half", "--dtype", "bfloat16"]


def test_a_bfloat16_export_on_a_cpu_is_checked_on_openvino_and_says_why(tmp_path, monkeypatch):
    """ONNX Runtime's CPU provider has no bf16 kernels (and no GPU here): the export's check
    picks OpenVINO, says so in one line, and passes on it."""
    pytest.importorskip("openvino")
    unavailable_here(monkeypatch, "ort-cuda", "ort-cuda-graph")
    r = run(*BF16_EXPORT, "-o", tmp_path / "bf16")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(line.startswith("openvino-cpu ran on cpu") for line in lines), r.output
    assert ("openvino-cpu picked in place of the file's default runners (ort-cpu, ort-cuda), "
            "which cannot run it here") in lines
    assert lines[-1].startswith("PASS: ")


def test_nothing_here_can_check_it_is_exit_3_and_said_so(tmp_path, monkeypatch):
    """No runner here can run a bf16 file (no OpenVINO, no GPU): the export is written, its
    last line says nothing here could check it, exit 3: neither a pass nor a parity failure."""
    unavailable_here(monkeypatch, *BF16_CAPABLE)
    r = run(*BF16_EXPORT, "-o", tmp_path / "bf16")
    assert r.exit_code == 3, r.output
    last = r.output.splitlines()[-1]
    assert last.startswith("UNCHECKED: nothing here could check it: no runner under test ran; "
                           "no runner installed here can run its file"), last
    assert "FAIL" not in r.output and "openvino-cpu SKIPPED" in r.output
    assert json.loads((tmp_path / "bf16" / "parity.json").read_text())["verdict"] == "unchecked"
    r = run("check", tmp_path / "bf16", "--seq-lens", "2")
    assert r.exit_code == 3 and r.output.splitlines()[-1].startswith("UNCHECKED: "), r.output


def test_named_runners_that_all_skip_are_exit_3_naming_those_that_can(tmp_path):
    """A CUDA graph replays only a static-cache step: named alone on a full-sequence folder,
    nothing under test ran; the last line names the runners that can run it here."""
    out = tmp_path / "art"
    assert run("onnx", *SMALL, "-o", out, "--no-check").exit_code == 0
    r = run("check", out, "--runners", "ort-cuda-graph", "--seq-lens", "2")
    assert r.exit_code == 3, r.output
    last = r.output.splitlines()[-1]
    assert last.startswith("UNCHECKED: nothing here could check it: no runner under test ran; "
                           "runners that can run it here: ort-cpu"), last
    assert "within tolerance" not in r.output and "ort-cuda-graph SKIPPED" in r.output


def test_a_file_given_for_its_folder_is_one_line_naming_the_folder(tmp_path):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "model.pte").write_bytes(b"")
    line = one_line_error(run("check", tmp_path / "art" / "model.pte"))
    assert line == (f"Error: {tmp_path / 'art' / 'model.pte'} is a file: give the artifact "
                    f"folder that holds it ({tmp_path / 'art'})")


# --- random configurations: every target passes its check or refuses in one line --------------
def random_export_args(rng: np.random.Generator) -> list[str]:
    """A layer (plain or MLA), a call kind, a form and lossy steps drawn at random: many
    combinations are refused, which is what the test wants to see done in one line."""
    heads = int(rng.choice([1, 2, 4]))
    args = ["--heads", str(heads), "--dim", str(heads * int(rng.choice([8, 16]))),
            "--max-seq-len", "16", "--seq-lens", "1,5,17", "--seed", str(int(rng.integers(99)))]
    pick = lambda *options: options[int(rng.integers(len(options)))]  # noqa: E731
    if rng.random() < 0.2:
        args += ["--kv-lora-rank", "16", "--qk-rope-head-dim", "4", "--qk-nope-head-dim", "8",
                 "--v-head-dim", "8"]
    else:
        args += pick([], ["--kv-heads", "1"], ["--rotary", "half"], ["--qk-norm", "head"],
                     ["--qk-norm", "head", "--qk-norm-type", "layer", "--qk-norm-bias",
                      "--qk-norm-per-head"], ["--softcap", "5"], ["--sliding-window", "4"], ["--sinks"],
                     ["--output-gate"], ["--layout", pick("fused", "stacked", "single")])
    args += pick([], ["--kv-cache"], ["--static-cache"], ["--attention-mask"])
    lossy = rng.random() < 0.3  # ONNX-only (and the int8 cache static-only): often refused
    return args + (pick(["--quantize", "int4"], ["--quantize", "int8"],
                        ["--kv-cache-dtype", "int8"]) if lossy else [])


@pytest.mark.parametrize("target, seeds", [("onnx", range(10)), ("torchscript", range(4)),
                                           ("aoti", range(2))])
def test_random_configurations_pass_or_are_refused_in_one_line(tmp_path, target, seeds):
    outcomes = []
    for seed in seeds:
        args = random_export_args(np.random.default_rng([seed, *map(ord, target)]))
        r = run(target, *args, "-o", tmp_path / f"{target}-{seed}")
        outcomes.append((r.exit_code, args))
        assert "Traceback" not in r.output, (args, r.output[-3000:])
        assert r.exit_code in (0, 2), (args, r.output[-3000:])
        if r.exit_code == 2:
            assert one_line_error(r), args
    assert any(code == 0 for code, _ in outcomes)  # not everything refused
