"""The AOTInductor target (torch.export + AOTInductor, model.pt2) and the aoti-cpu runner: one
small package compiled per session (a compile takes tens of seconds) and reused."""
import json
import shutil

import torch

from mha_export import check_parity
from mha_export.targets.aoti.runner import AotiRunner
from mha_export.signature import make_signature

from conftest import AOTI_CONFIG as CFG

SWEEP = dict(seq_lens=[1, 5, 17], batch_sizes=[1, 3], past_lens=[0, 1, 6])


def test_package_declares_its_io_and_loads(kv_package):
    meta = json.loads((kv_package / "config.json").read_text())
    assert meta["format"] == "aoti" and meta["export"]["file"] == "model.pt2"
    assert meta["export"]["dynamic_axes"]["past_key"] == {"0": "batch", "2": "past_seq"}
    assert [t["name"] for t in meta["io"]["inputs"]] == ["x", "attention_mask", "past_key",
                                                         "past_value", "position_ids"]
    assert callable(torch._inductor.aoti_load_package(str(kv_package / "model.pt2")))


def test_check_passes_with_aoti_rows(kv_package):
    report = check_parity(kv_package, **SWEEP)
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    ran = {i.name: i.status for i in report.runners}
    assert ran["aoti-cpu"] == "ran" and "aoti-cuda" in ran  # cuda: ran on a GPU, else skipped
    rows = [r for r in report.results if r.runner == "aoti-cpu"]
    assert {(r.batch, r.seq, r.past) for r in rows} >= {(1, 1, 0), (3, 17, 6)}
    assert any(r.scenario.startswith("generate") for r in rows)


def test_a_nudged_source_weight_fails_the_check(kv_package, tmp_path):
    """The package and its source weights disagree: the check (eager from the weights) fails."""
    from safetensors.torch import load_file, save_file
    copy = tmp_path / "kv"
    shutil.copytree(kv_package, copy)
    weights = load_file(str(copy / "weights.safetensors"))
    weights["W_query.weight"][0, 0] += 1e-3
    save_file(weights, str(copy / "weights.safetensors"))
    report = check_parity(copy, runners=["aoti-cpu"], seq_lens=[5], batch_sizes=[1],
                          past_lens=[0])
    assert not report.passed
    assert {r.runner for r in report.results if not r.passed} == {"aoti-cpu"}


def test_runner_runs_the_unseen_shapes(kv_package):
    sig = make_signature(CFG, "kv-cache")
    runner = AotiRunner(sig, kv_package / "model.pt2")
    import numpy as np
    for b, t, p in ((1, 1, 0), (4, 2, 1), (2, 33, 9)):
        feeds = {"x": np.zeros((b, t, 32), np.float32),
                 "attention_mask": np.ones((b, p + t), np.int64),
                 "past_key": np.zeros((b, 2, p, 16), np.float32),
                 "past_value": np.zeros((b, 2, p, 16), np.float32),
                 "position_ids": np.tile(np.arange(p, p + t), (b, 1))}
        out = runner.run(feeds)
        assert out["y"].shape == (b, t, 32) and out["present_key"].shape == (b, 2, p + t, 16)


def test_a_package_with_a_specialised_seq_axis_fails_the_check(kv_package, tmp_path):
    """The fault of an export without dynamic shapes: the package only runs the example's sizes
    (batch 2, seq 3, past 5); the sweep's unseen sizes fail their rows (exit 1), never pass."""
    from mha_export.targets.aoti import export as to_aoti
    from mha_export.artifact import read_artifact
    from mha_export.layer.entry import entry_module
    copy = tmp_path / "kv"
    shutil.copytree(kv_package, copy)
    art = read_artifact(copy)
    sig = art.signature
    entry = entry_module(art.load_source_module(), sig.kind, sig.input_names, sig.output_names)
    program = to_aoti._export(entry, sig, "cpu", dynamic_axes=False)  # the exporter's bug
    to_aoti.compile_package(program, copy / "model.pt2", sig, "cpu")
    report = check_parity(copy, runners=["aoti-cpu"], seq_lens=[3, 5], batch_sizes=[2],
                          past_lens=[5])
    assert not report.passed
    failed = {(r.batch, r.seq, r.past) for r in report.results
              if r.runner == "aoti-cpu" and not r.passed}
    assert (2, 5, 5) in failed and (2, 3, 5) not in failed  # the example's own size still runs
    assert any("compiled for x [2, 3, 32]" in r.error for r in report.results if not r.passed)


# --- the static-cache package: the app's buffers written in place -------------------------------

def test_static_package_passes_the_check_in_place(static_package):
    """generate, ragged rows and the buffers after the run, through aoti-cpu; the valid prefix
    is a data-dependent length in torch.export (an unbacked size, checked against the buffer)."""
    report = check_parity(static_package, seq_lens=[1, 5], batch_sizes=[1, 3], past_lens=[0, 6])
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    scenarios = {" ".join(r.scenario.split()[:2]) for r in report.results
                 if r.runner == "aoti-cpu"}
    assert {"static generate", "static ragged"} <= scenarios, scenarios


def test_static_package_writes_the_callers_buffers(static_package):
    import numpy as np
    sig = make_signature(CFG, "static-cache")
    runner = AotiRunner(sig, static_package / "model.pt2")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 32)).astype(np.float32),
             "past_key": np.zeros((2, 2, 12, 16), np.float32),
             "past_value": np.zeros((2, 2, 12, 16), np.float32),
             "past_lengths": np.array([0, 4]), "position_ids": np.array([[0, 1, 2], [4, 5, 6]])}
    args = runner.prepare(feeds)
    y, key, value = runner.run_prepared(args)
    assert key.data_ptr() == args[1].data_ptr() and value.data_ptr() == args[2].data_ptr()
    written = args[1].abs().sum(dim=(1, 3)) > 0  # (B, C): the entries this call wrote
    assert written[0].tolist() == [True] * 3 + [False] * 9
    assert written[1].tolist() == [False] * 4 + [True] * 3 + [False] * 5


def test_a_static_package_returning_copies_fails_the_check(static_package, monkeypatch):
    """Planted fault: present_* come back as copies and the app's buffers stay unwritten."""
    original = AotiRunner.run_prepared

    def copying(self, args):
        return original(self, [a.clone() for a in args])

    monkeypatch.setattr(AotiRunner, "run_prepared", copying)
    report = check_parity(static_package, runners=["aoti-cpu"], seq_lens=[3], batch_sizes=[1],
                          past_lens=[2])
    assert not report.passed
    assert any("is a copy" in r.error for r in report.results if not r.passed)


def test_a_single_head_static_step_exports_or_is_refused_in_one_line(tmp_path):
    """Inductor's lowering of a single head's cache read guards on the data-dependent valid
    length (torch 2.13: GuardOnDataDependentSymNode); whatever the compiler does, the user
    gets a package or one line naming the stage, never a traceback."""
    from click.testing import CliRunner
    from mha_export.cli.commands import cli
    result = CliRunner().invoke(cli, ["aoti", "--heads", "1", "--dim", "32", "--softcap", "5",
                                      "--static-cache", "--max-seq-len", "64", "-o",
                                      str(tmp_path / "a")])
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(errors) == 1, result.output
        assert "AOTInductor's compile of model.pt2 failed" in errors[0]
        assert not (tmp_path / "a").exists()
