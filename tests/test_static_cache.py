"""The static-cache decode model: one app-owned buffer written in place at each row's
past_lengths, read only as far as it is valid; ONNX (auto, the default: GroupQueryAttention or
the blocked loop by call; decomposed: standard ops; contrib-gqa: ONNX Runtime's
GroupQueryAttention) and TorchScript, proven by the check and by planted faults."""
import numpy as np
import pytest
import torch

from mha_export import MHAConfig, UsageError, check_parity, export_onnx, export_torchscript
from mha_export.check.runners.ort import OrtRunner
from mha_export.signature import make_signature

import faults

CFG = MHAConfig(dim=64, heads=4, kv_heads=2, max_seq_len=24, rotary="half")
SWEEP = dict(seq_lens=[1, 4, 9, 300], batch_sizes=[1, 3], past_lens=[0, 5], providers=["cpu"])
# 300: two query blocks; auto: GroupQueryAttention for its calls, the blocked loop for the rest
FORMS = ["auto", "decomposed", "contrib-gqa", "blocked", "blocked-plain"]


@pytest.fixture(scope="module", params=FORMS)
def static_artifact(request, tmp_path_factory):
    return export_onnx(CFG, tmp_path_factory.mktemp("s") / "art", attention=request.param,
                       static_cache=True, validate=False).path


def test_declared_io_is_the_contract(static_artifact):
    import json
    io = json.loads((static_artifact / "config.json").read_text())["io"]
    assert [t["name"] for t in io["inputs"]] == ["x", "past_key", "past_value", "past_lengths",
                                                 "position_ids"]
    assert io["inputs"][1]["shape"] == ["batch", 2, "max_cache", 16]
    assert io["inputs"][3] | {"doc": ""} == {"name": "past_lengths", "dtype": "int64",
                                             "shape": ["batch"], "doc": ""}
    assert io["outputs"][1]["shape"] == ["batch", 2, "max_cache", 16]


def test_check_passes_with_scenarios(static_artifact):
    report = check_parity(static_artifact, **SWEEP)
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    scenarios = {r.scenario.split(" ")[1] for r in report.results if r.scenario}
    assert scenarios == {"generate", "ragged"}


@pytest.mark.parametrize("fault", sorted(faults.STATIC_FAULTS))
def test_planted_static_fault_is_caught(tmp_path, fault):
    for form in FORMS:
        path = export_onnx(CFG, tmp_path / form, attention=form, static_cache=True,
                           validate=False).path
        try:
            faults.STATIC_FAULTS[fault](path / "model.onnx")
        except faults.NotApplicable:
            continue
        assert not check_parity(path, **SWEEP).passed, form
        return
    pytest.fail(f"{fault}: no form to plant it in")


def test_the_onnx_runner_binds_present_to_the_past_buffer(static_artifact):
    """IO binding: the outputs are the very buffers passed in (same memory), written in place."""
    sig = make_signature(CFG, "static-cache")
    runner = OrtRunner(sig, static_artifact / "model.onnx")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 1, 64), dtype=np.float32),
             "past_key": rng.standard_normal((2, 2, 16, 16), dtype=np.float32),
             "past_value": rng.standard_normal((2, 2, 16, 16), dtype=np.float32),
             "past_lengths": np.array([4, 9]), "position_ids": np.array([[4], [9]])}
    call = runner.prepare(feeds)
    before = call.inputs["past_key"].copy()
    y, key, value = call.run()
    assert key is call.inputs["past_key"] and key.ctypes.data == call.buffers["past_key"].data_ptr()
    changed = np.argwhere((key != before).any(axis=(1, 3)))  # (row, entry) pairs written
    assert sorted(map(tuple, changed)) == [(0, 4), (1, 9)]


def test_a_bound_cache_steps_as_run_does_in_the_callers_arrays(static_artifact):
    """bind_cache (an app's loop: the buffers bound once) gives run's y and cache, call after
    call, and writes the caller's own arrays; a buffer of another dtype is refused."""
    sig = make_signature(CFG, "static-cache")
    runner = OrtRunner(sig, static_artifact / "model.onnx")
    rng = np.random.default_rng(1)
    buffers = {n: np.zeros((1, 2, 16, 16), np.float32) for n in ("past_key", "past_value")}
    step = runner.bind_cache(buffers)
    plain = {n: b.copy() for n, b in buffers.items()}
    at = 0
    for t in (5, 1, 1, 3):  # a prefill, two steps, a chunk
        feeds = {"x": rng.standard_normal((1, t, 64), dtype=np.float32),
                 "past_lengths": np.array([at]), "position_ids": np.arange(at, at + t)[None]}
        want = runner.run({**feeds, **plain})
        plain = {"past_key": want["present_key"], "past_value": want["present_value"]}
        np.testing.assert_array_equal(step(feeds), want["y"])
        for name in buffers:
            np.testing.assert_array_equal(buffers[name], plain[name])
        at += t
    assert np.abs(buffers["past_key"][0, :, :at]).min() > 0 and not buffers["past_key"][0, :, at:].any()
    with pytest.raises(ValueError, match="float32"):
        runner.bind_cache({n: b.astype(np.float64) for n, b in buffers.items()})


def test_default_form_routes_each_call(tmp_path):
    """auto (the default): GroupQueryAttention for single tokens and short calls at batch 1, the
    blocked loop for the rest (a chunk at batch 3 over a cache, which the node refuses: right
    here, see the scenarios), both writing the same buffer."""
    import json
    import onnx
    path = export_onnx(CFG, tmp_path / "d", static_cache=True, validate=False).path
    assert json.loads((path / "config.json").read_text())["export"]["attention"] == "auto"
    branches = next(n for n in onnx.load(str(path / "model.onnx")).graph.node
                    if n.op_type == "If").attribute
    ops = {a.name: {n.op_type for n in a.g.node} for a in branches}
    assert "GroupQueryAttention" in ops["then_branch"] and "Loop" in ops["else_branch"]


def test_gqa_poisons_a_chunk_over_a_cache_at_batch_above_one(tmp_path):
    """ONNX Runtime's kernel cannot run it (its total_sequence_length comes from shapes, so it
    takes the call for a batch of prompts): NaN, never a wrong number, and the check fails."""
    path = export_onnx(CFG, tmp_path / "g", attention="contrib-gqa", static_cache=True,
                       validate=False).path
    runner = OrtRunner(make_signature(CFG, "static-cache"), path / "model.onnx")
    feeds = {"x": np.zeros((2, 3, 64), np.float32), "past_key": np.zeros((2, 2, 16, 16), np.float32),
             "past_value": np.zeros((2, 2, 16, 16), np.float32), "past_lengths": np.array([4, 2]),
             "position_ids": np.array([[4, 5, 6], [2, 3, 4]])}
    assert np.isnan(runner.run(feeds)["y"]).all()
    feeds["past_lengths"] = np.array([0, 0])  # the same call over an empty cache runs
    assert np.isfinite(runner.run(feeds)["y"]).all()


def test_torchscript_writes_in_place_and_a_copy_fails(tmp_path):
    path = export_torchscript(CFG, tmp_path / "ts", static_cache=True, validate=False).path
    assert check_parity(path, **SWEEP).passed
    inner = torch.jit.load(str(path / "model.pt"))

    class Copying(torch.nn.Module):  # present returned as a copy, the buffer left unwritten
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x, past_key, past_value, past_lengths, position_ids):
            return self.inner(x, past_key.clone(), past_value.clone(), past_lengths,
                              position_ids)
    torch.jit.script(Copying()).save(str(path / "model.pt"))
    report = check_parity(path, **SWEEP)
    assert not report.passed
    assert any("is a copy" in r.error for r in report.results if not r.passed)


def test_static_cache_flags_are_exclusive(tmp_path):
    with pytest.raises(UsageError, match="choose one of"):
        export_onnx(CFG, tmp_path / "x", static_cache=True, kv_cache=True)


@pytest.mark.parametrize("form", ["blocked", "blocked-plain"])
def test_blocked_static_forms_with_a_window_shorter_than_the_rows(tmp_path, form):
    """Query blocks over one buffer, each row from its own past_lengths, a window of 5: the
    block reads the longest row's keys and the shortest row's window."""
    config = CFG.replace(sliding_window=5)
    path = export_onnx(config, tmp_path / "w", attention=form, static_cache=True,
                       validate=False).path
    assert check_parity(path, **SWEEP).passed


def _step_feeds(rng, past: int, dtype=np.float32) -> dict:
    return {"x": rng.standard_normal((2, 1, 64)).astype(dtype),
            "past_key": rng.standard_normal((2, 2, 24, 16)).astype(dtype),
            "past_value": rng.standard_normal((2, 2, 24, 16)).astype(dtype),
            "past_lengths": np.array([past, past + 3]), "position_ids": np.array([[past], [past + 3]])}


def test_replays_take_each_calls_fresh_inputs_and_stale_ones_fail(monkeypatch, tmp_path):
    """The graph runner's buffers are bound once per shape and refreshed per call (exercised
    here on CPU buffers, without a graph): every call equals a fresh session's on the same
    inputs; a runner that left the first call's inputs in place gives the wrong answers."""
    from mha_export.check.runners import ort, ort_graphs
    path = export_onnx(CFG, tmp_path / "a", static_cache=True, validate=False).path
    sig = make_signature(CFG, "static-cache")
    plain = OrtRunner(sig, path / "model.onnx")

    def replayed() -> OrtRunner:
        runner = OrtRunner(sig, path / "model.onnx")
        runner.graphs = ort.GraphReplays(
            lambda dims, graph: ort._session(path / "model.onnx", "cpu", None, True, fixed=dims),
            runner.session, sig, "cpu")
        return runner

    rng = np.random.default_rng(1)
    cases = [_step_feeds(rng, past) for past in (2, 7, 11)]
    runner = replayed()
    for feeds in cases:
        got, want = runner.run(feeds), plain.run(feeds)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
    assert len(runner.graphs.calls) == 1  # one shape, one set of bound buffers
    assert ort_graphs.fixed_dims(runner.graphs.dims, cases[0]) == {"batch": 2, "seq": 1,
                                                             "max_cache": 24}
    monkeypatch.setattr(ort.InPlaceCall, "refresh", lambda self, inputs: self)
    stale = replayed()
    stale.run(cases[0])
    assert not np.allclose(stale.run(cases[1])["y"], plain.run(cases[1])["y"], atol=1e-3)


def test_a_shape_onnx_runtime_will_not_capture_runs_without_a_graph_and_is_said(tmp_path):
    """As an app runs it (its prefill without a graph): never silently, the runner's line
    names the shapes replayed and the ones not, with ONNX Runtime's reason."""
    from mha_export.check.runners import ort, ort_graphs
    path = export_onnx(CFG, tmp_path / "a", static_cache=True, validate=False).path
    sig = make_signature(CFG, "static-cache")
    runner = OrtRunner(sig, path / "model.onnx")

    def open_session(dims, graph):
        if graph and dims["seq"] > 1:
            raise ort.RunnerUnavailable(f"could not start: [ONNXRuntimeError] : 1 : FAIL : "
                                        f"{ort_graphs.CAPTURE_REFUSED} as the model has control flow "
                                        "nodes")
        return ort._session(path / "model.onnx", "cpu", None, True, fixed=dims)

    runner.graphs = ort.GraphReplays(open_session, runner.session, sig, "cpu")
    rng = np.random.default_rng(2)
    step, prompt = _step_feeds(rng, 3), _step_feeds(rng, 3)
    prompt["x"] = rng.standard_normal((2, 4, 64)).astype(np.float32)
    prompt["position_ids"] = np.array([[3, 4, 5, 6], [6, 7, 8, 9]])
    for feeds in (step, prompt):
        runner.run(feeds)
    note = runner.ran_note()
    assert note.startswith("replayed as CUDA graphs: batch=2 seq=1;") and \
        "control flow nodes): batch=2 seq=4" in note
    assert runner.ran_failure() == ""
    runner.graphs.uncaptured["batch=2 seq=1"] = "refused"  # as if no shape were captured
    assert "no shape was replayed" in runner.ran_failure()


def test_the_graph_runner_refuses_what_it_cannot_replay(tmp_path):
    from mha_export.check.runners.ort import cuda_graph_refusal
    full = make_signature(CFG, "full")
    assert "only the static-cache step" in cuda_graph_refusal(full, "cuda")
    assert "needs the CUDA provider" in cuda_graph_refusal(make_signature(CFG, "static-cache"),
                                                            "cpu")
    path = export_onnx(CFG, tmp_path / "a", static_cache=True, validate=False).path
    report = check_parity(path, runners=["ort-cpu", "ort-cuda-graph"], seq_lens=[1],
                          batch_sizes=[1], past_lens=[0])
    graph = next(r for r in report.to_dict()["runners"] if r["name"] == "ort-cuda-graph")
    if not _cuda_provider_runs():
        assert graph["status"] == "skipped" and graph["reason"]  # said, never a pass
    full_path = export_onnx(CFG, tmp_path / "f", validate=False).path
    report = check_parity(full_path, runners=["ort-cpu", "ort-cuda-graph"], seq_lens=[1],
                          batch_sizes=[1])
    graph = next(r for r in report.to_dict()["runners"] if r["name"] == "ort-cuda-graph")
    assert graph["status"] == "skipped" and "only the static-cache step" in graph["reason"]


def _cuda_provider_runs() -> bool:
    import torch
    import onnxruntime
    return torch.cuda.is_available() and \
        "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.mark.skipif(not _cuda_provider_runs(), reason="no CUDA device with ONNX Runtime's "
                                                      "CUDAExecutionProvider here")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])  # GQA: no fp32 CUDA kernel
def test_the_replayed_graph_passes_and_a_stale_replay_fails_on_cuda(monkeypatch, tmp_path, dtype):
    from mha_export.check.runners import ort
    path = export_onnx(CFG, tmp_path / "a", static_cache=True, dtype=dtype,
                       validate=False).path
    sweep = dict(seq_lens=[1, 4], batch_sizes=[1, 3], past_lens=[0, 5], require_cuda=True)
    report = check_parity(path, runners=["ort-cuda-graph"], **sweep)
    assert report.passed, [r.error for r in report.results if not r.passed][:3]
    line = next(r for r in report.runners if r.name == "ort-cuda-graph").precision
    assert "replayed as CUDA graphs: batch=1 seq=1" in line, line
    monkeypatch.setattr(ort.InPlaceCall, "refresh", lambda self, inputs: self)
    assert not check_parity(path, runners=["ort-cuda-graph"], **sweep).passed
