"""The benchmark's plumbing (speed itself is measured by `mha-export bench`, never asserted)."""
import json

import pytest
import torch

from click.testing import CliRunner

from mha_export import MHAConfig
from mha_export.artifact import read_artifact
from mha_export.bench.driver import effective_flops, run_bench
from mha_export.cli.commands import cli
from mha_export.errors import UsageError


def test_flop_count_matches_the_documented_formula():
    c, t, d = MHAConfig(dim=768, heads=12), 2048, 768
    assert effective_flops(c, t, 1) == 8 * t * d * d + 2 * t * t * d


def test_every_variant_measured_side_by_side():
    report = run_bench(MHAConfig(dim=32, heads=2), seq_lens=[8], providers=["cpu"], budget_s=0.01)
    names = [r.variant for r in report.rows]
    assert names[:3] == ["textbook-eager", "sdpa-eager", "torchscript"]
    assert any(n.startswith("ort-cpu-") for n in names)
    for r in report.rows:
        assert r.error == "" and r.median_ms > 0 and r.peak_rss_mib > 0 and r.speedup_vs_sdpa > 0
    assert report.gemm_ceiling_gflops > 0


def test_a_failing_variant_is_a_row_not_a_crash():
    """Under a 1.5 GiB cap the textbook's (4, 8192, 8192) score matrix cannot be allocated; SDPA,
    linear in T, still runs: the failure is reported in its own row."""
    report = run_bench(MHAConfig(dim=64, heads=4), seq_lens=[8192], providers=["cpu"],
                       forms=["decomposed"], budget_s=0.01, mem_limit_gib=1.5)
    rows = {r.variant: r for r in report.rows}
    assert "out of memory" in rows["textbook-eager"].error
    assert rows["sdpa-eager"].error == "" and rows["sdpa-eager"].median_ms > 0


def test_cli_writes_json_and_plot(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "--heads", "2", "--dim", "32", "--seq-lens", "4,16",
                                 "--forms", "decomposed", "--budget", "0.01", "--providers", "cpu",
                                 "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "b.json").read_text())
    assert {row["seq"] for row in data["rows"]} == {4, 16}
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_rejects_unknown_form():
    r = CliRunner().invoke(cli, ["bench", "--forms", "flash"])
    assert r.exit_code == 2 and "--forms" in r.stderr


def test_cli_cpp_folder_without_the_programs_is_refused_before_any_work(tmp_path):
    from click.testing import CliRunner
    from mha_export.cli.commands import cli
    r = CliRunner().invoke(cli, ["bench", "--heads", "2", "--dim", "32", "--seq-lens", "4",
                                 "--cpp", str(tmp_path)])
    assert r.exit_code == 2 and "no mha_torch there (build with `make cpp`)" in r.output, r.output


def _saved_report(tmp_path, rows):
    from mha_export.bench.report import BenchReport, BenchRow
    report = BenchReport({"heads": 4, "dim": 64, "kv_heads": 4}, 2, 100.0,
                         {"cpu": "Test CPU", "date": "2026-11-24", "versions": {"torch": "x"}},
                         [BenchRow(*r) for r in rows], command="mha-export bench --kv-cache")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report.to_dict()))
    return path


def test_from_json_markdown_pivots_calls_by_variant_and_names_its_source(tmp_path):
    rows = [("sdpa-eager", 1, 1, 128, 2.0), ("ort-cpu-auto", 1, 1, 128, 0.5),
            ("sdpa-eager", 1, 1, 1024, 4.0)]
    path = _saved_report(tmp_path, rows)
    data = json.loads(path.read_text())
    data["rows"][1]["speedup_vs_sdpa"] = 4.0
    data["rows"][0]["peak_rss_mib"] = 100.0
    path.write_text(json.dumps(data))
    out = CliRunner().invoke(cli, ["bench", "--from-json", str(path), "--markdown"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "| call | `sdpa-eager` | `ort-cpu-auto` |"
    assert lines[2] == "| past 128 | 2 ms<br>100 MiB | 0.5 ms (4.00×) |"
    assert lines[3] == "| past 1024 | 4 ms | – |"
    assert "Test CPU, 2026-11-24" in out.output and "`mha-export bench --kv-cache`" in out.output
    assert str(path) in out.output


def test_from_json_refuses_a_file_that_is_not_a_run(tmp_path):
    (tmp_path / "x.json").write_text('{"rows": 3}')
    out = CliRunner().invoke(cli, ["bench", "--from-json", str(tmp_path / "x.json")],
                             standalone_mode=False)
    assert out.exit_code != 0 and "not a bench JSON" in str(out.exception or out.output)


def test_plot_of_decode_steps_reads_against_the_past(tmp_path):
    pytest.importorskip("matplotlib")
    from mha_export.bench.report import BenchReport
    path = _saved_report(tmp_path, [("sdpa-eager", 1, 1, 128, 2.0, 5, None, None, None, None,
                                     100.0)])
    report = BenchReport.load(path)
    assert report.decode
    out = CliRunner().invoke(cli, ["bench", "--from-json", str(path), "--plot",
                                   str(tmp_path / "p.png")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "p.png").stat().st_size > 0


def test_quantized_variants_record_their_smaller_files_and_bytes(tmp_path):
    """--quantize: every form also with quantized projections, its model file's size and the
    bytes a step reads counted as the quantized weights (GB/s of what is really read)."""
    from mha_export.bench.driver import step_bytes
    from mha_export.lossy.registry import weight_bytes
    from mha_export.lossy.projections.rtn import QuantSpec
    c = MHAConfig(dim=64, heads=4)
    int4 = QuantSpec(bits=4, accuracy_level=4)
    report = run_bench(c, seq_lens=[1], past_lens=[8], static_cache=True, capacity=16,
                       providers=["cpu"], forms=["auto"], budget_s=0.01,
                       quantize=[int4, QuantSpec(bits=8, accuracy_level=1)])
    rows = {r.variant: r for r in report.rows}
    assert {"ort-cpu-auto", "ort-cpu-auto-int4", "ort-cpu-auto-int8-fp32"} <= set(rows)
    assert all(r.error == "" for r in rows.values())
    assert rows["ort-cpu-auto-int4"].model_mib < rows["ort-cpu-auto-int8-fp32"].model_mib \
        < rows["ort-cpu-auto"].model_mib
    assert weight_bytes(c, {"quantize": int4}) == 4 * (64 * 2 * 16 + 4 * 64 * 2)  # codes + scales, 4 matrices
    row = rows["ort-cpu-auto-int4"]
    assert row.bandwidth_gbs == pytest.approx(step_bytes(c, 1, 1, 8, {"quantize": int4})
                                              / (row.median_ms / 1e3) / 1e9)


def test_int8_cache_variants_read_one_byte_per_cached_value(tmp_path):
    """--kv-cache-dtype int8 (static cache): every form that builds one also with an int8
    cache (and with each quantization), its rows' bytes counting 1-byte codes."""
    from mha_export.bench.driver import step_bytes
    from mha_export.lossy.projections.rtn import QuantSpec
    c = MHAConfig(dim=64, heads=4, kv_heads=2)
    report = run_bench(c, seq_lens=[1], past_lens=[8], static_cache=True, capacity=16,
                       providers=["cpu"], forms=["auto"], budget_s=0.01,
                       quantize=[QuantSpec(bits=4, accuracy_level=4)], int8_cache=True)
    rows = {r.variant: r for r in report.rows}
    assert {"ort-cpu-auto-kv8", "ort-cpu-auto-int4-kv8"} <= set(rows)
    assert all(r.error == "" for r in rows.values()), [r.error for r in rows.values()]
    row = rows["ort-cpu-auto-kv8"]
    assert row.bandwidth_gbs == pytest.approx(step_bytes(c, 1, 1, 8, {"int8-cache": "int8"})
                                              / (row.median_ms / 1e3) / 1e9)
    assert step_bytes(c, 1, 1, 8) - step_bytes(c, 1, 1, 8, {"int8-cache": "int8"}) == 3 * 2 * 32 * 9
    with pytest.raises(UsageError, match="--static-cache"):
        run_bench(c, seq_lens=[1], past_lens=[8], kv_cache=True, int8_cache=True)


def test_cold_rows_step_a_ring_larger_than_the_last_level_cache(monkeypatch):
    from mha_export.bench import driver
    monkeypatch.setattr(driver, "last_level_cache_bytes", lambda: 2**20)  # 1 MiB: small rings
    report = run_bench(MHAConfig(dim=64, heads=4), seq_lens=[1], past_lens=[8], kv_cache=True,
                       providers=["cpu"], forms=["decomposed"], budget_s=0.01, cold=True)
    step = driver.step_bytes(MHAConfig(dim=64, heads=4), 1, 1, 8)
    assert all(r.ring == -(-driver.RING * 2**20 // int(step)) for r in report.rows)
    assert all(r.error == "" for r in report.rows) and report.stream_bandwidth_gbs > 0


@pytest.mark.parametrize("args, message", [
    (["--quantize", "int3"], "--quantize 'int3': choose one of int4, int8"),
    (["--quantize", "int4", "--accuracy-level", "2"], "accuracy level 2: choose one of 1, 4"),
    (["--cold", "--cpp", "{tmp}"], "--cold steps a ring of instances in Python: not with --cpp"),
    (["--quantize", "source", "--static-cache"], "--quantize source keeps a checkpoint's own "
                                                 "quantized weights: it needs --weights FILE.gguf "
                                                 "or a quantized Hugging Face folder"),
])
def test_cli_refuses_bad_quantization_and_cold_requests(tmp_path, args, message):
    (tmp_path / "mha_torch").touch()
    r = CliRunner().invoke(cli, ["bench", "--heads", "2", "--dim", "32", "--seq-lens", "4",
                                 *(a.format(tmp=tmp_path) for a in args)])
    assert r.exit_code == 2 and message in r.output, r.output


@pytest.mark.parametrize("args, message", [
    (["--past-lens", "8"], "--past-lens is not used without --kv-cache or --static-cache"),
    (["--kv-cache", "--capacity", "16"], "--capacity is not used without --static-cache"),
    (["--accuracy-level", "1"], "--accuracy-level is not used without --quantize"),
    (["--from-json", "{tmp}/run.json"], "--from-json shows a saved run, measuring nothing: "
                                        "--heads is not used with it"),
    (["{tmp}"], "ARTIFACT's own layer is measured: --heads describes another"),
])
def test_options_a_run_would_not_use_are_refused_in_one_line(tmp_path, args, message):
    """Each was accepted and ignored."""
    (tmp_path / "run.json").write_text("{}")
    r = CliRunner().invoke(cli, ["bench", "--heads", "2", "--dim", "32", "--seq-lens", "4",
                                 *(a.format(tmp=tmp_path) for a in args)])
    assert r.exit_code == 2 and message in r.output, r.output


def test_bench_of_a_quantized_artifact_measures_its_quantization(tmp_path, monkeypatch):
    from mha_export import export_onnx
    from mha_export.bench import driver
    from mha_export.lossy.projections.rtn import QuantSpec
    art = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "q", validate=False,
                      quantize=QuantSpec(bits=8, block_size=16)).path
    seen = {}
    monkeypatch.setattr(driver, "run_bench", lambda config, plan, **kw: seen.update(
        vars(plan), **kw) or driver.BenchReport(config.to_dict(), 1, None,
                                                {"cpu": "-", "date": "-"}))
    r = CliRunner().invoke(cli, ["bench", str(art), "--seq-lens", "4", "--forms", "auto"])
    assert r.exit_code == 0, r.output
    assert seen["quantize"] == [QuantSpec(bits=8, block_size=16)]
    weights = seen["weights_module"].to_weights().wq
    assert torch.equal(weights, read_artifact(art).load_plain_module().to_weights().wq)


def test_cold_needs_a_known_cache_size(monkeypatch):
    from mha_export.bench import driver
    from mha_export.errors import UsageError
    monkeypatch.setattr(driver, "last_level_cache_bytes", lambda: 0)
    with pytest.raises(UsageError, match="--cold"):
        run_bench(MHAConfig(dim=32, heads=2), seq_lens=[1], cold=True, providers=["cpu"])


def test_a_gguf_layer_benched_with_its_own_blocks(tmp_path, monkeypatch):
    """--quantize source: the GGUF's kept blocks measured beside the float export and our int4,
    the row named by the file's types, a step's bytes counted as the kept blocks' (both nodes of
    a Q5_K projection)."""
    pytest.importorskip("gguf")
    from test_source_quant import write_blocks
    from mha_export.bench import driver
    from mha_export.bench.driver import step_bytes
    from mha_export.lossy.registry import weight_bytes
    from mha_export.weights.gguf import layer_raw_tensors
    from mha_export.lossy.projections.gguf_blocks import source_blocks
    from mha_export.lossy.projections.source import SourceQuantSpec, kept_quantization
    for figure in ("gemm_ceiling", "copy_bandwidth"):  # the machine's figures: not this test's
        monkeypatch.setattr(driver, figure, lambda *a: None)
    gguf_file = write_blocks(tmp_path / "w.gguf", ("Q4_K", "Q6_K", "Q5_K", "Q3_K"))
    r = CliRunner().invoke(cli, ["bench", "--weights", gguf_file, "--layer", "0", "--static-cache",
                                 "--capacity", "16", "--seq-lens", "1", "--past-lens", "8",
                                 "--forms", "auto", "--quantize", "source,int4", "--budget",
                                 "0.01", "--providers", "cpu", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "b.json").read_text())
    rows = {row["variant"]: row for row in data["rows"]}
    kept = "ort-cpu-auto-gguf-q3_k-q4_k-q5_k-q6_k"
    assert {"ort-cpu-auto", kept, "ort-cpu-auto-int4"} <= set(rows)  # int4: level 4, its default
    assert all(row["error"] == "" for row in rows.values()), [row["error"] for row in rows.values()]
    c = MHAConfig.from_dict(data["config"])
    raw = layer_raw_tensors(gguf_file, 0)
    blocks = {t.ggml_type: source_blocks(t.data, t.ggml_type, t.shape[1]) for t in raw.values()
              if t.ggml_type.startswith("Q")}
    low, high = blocks["Q5_K"].split_high_bit()
    want = sum(b.stored_bytes() for t, b in blocks.items() if t != "Q5_K") \
        + low.stored_bytes() + high.stored_bytes()
    spec = SourceQuantSpec.from_dict(kept_quantization(gguf_file, 0, c, 1).to_dict())  # record
    assert weight_bytes(c, {"quantize": spec}) == want < weight_bytes(c, {})
    row = rows[kept]
    assert row["bandwidth_gbs"] == pytest.approx(step_bytes(c, 1, 1, 8, {"quantize": spec})
                                                 / (row["median_ms"] / 1e3) / 1e9)
    assert row["model_mib"] < rows["ort-cpu-auto"]["model_mib"]


def test_cached_rows_report_their_bytes_floor():
    """MiB read per step, GB/s, and the fraction of the run's copy bandwidth reached."""
    from mha_export.bench.report import BenchReport, BenchRow, floor_fraction, format_table, \
        step_mib
    row = BenchRow("ort-cpu-auto", 1, 1, past=1024, median_ms=10.0, bandwidth_gbs=15.0)
    report = BenchReport({}, 2, None, {"cpu": "x", "date": "d"}, [row], copy_bandwidth_gbs=20.0)
    assert step_mib(row) == pytest.approx(15e9 * 0.01 / 2**20)
    assert floor_fraction(report, row) == pytest.approx(0.75)
    assert "75%" in format_table(report) and "% floor" in format_table(report)


def test_cuda_rows_read_their_floor_at_the_gpus_bandwidth_and_show_their_copies():
    from mha_export.bench.report import BenchReport, BenchRow, floor_fraction, format_table
    gpu = BenchRow("ort-cuda-auto", 1, 1, past=1024, median_ms=0.1, bandwidth_gbs=2000.0,
                   timing="device-resident", copies_median_ms=0.5, device="cuda")
    cpu = BenchRow("ort-cpu-auto", 1, 1, past=1024, median_ms=10.0, bandwidth_gbs=15.0)
    report = BenchReport({}, 2, None, {"cpu": "x", "date": "d"}, [gpu, cpu],
                         copy_bandwidth_gbs=20.0, device_copy_bandwidth_gbs=4000.0)
    assert floor_fraction(report, gpu) == pytest.approx(0.5)
    assert floor_fraction(report, cpu) == pytest.approx(0.75)
    table = format_table(report)
    assert "ort-cuda-auto*" in table and "+copies ms" in table and "0.500" in table
    assert "device-resident" in table and "GPU copy bandwidth 4000 GB/s" in table


def test_a_half_precision_step_reads_half_the_bytes():
    from mha_export.bench.driver import step_bytes
    c = MHAConfig(dim=64, heads=4, kv_heads=2)
    assert step_bytes(c, 1, 1, 100, dtype="float16") * 2 == step_bytes(c, 1, 1, 100)


@pytest.mark.parametrize("kind", ["full", "static-cache"])
def test_a_resident_step_runs_the_call_with_nothing_read_back(tmp_path, kind):
    """What bench times on CUDA (here on CPU buffers): the bound call alone."""
    import numpy as np
    from mha_export import export_onnx
    from mha_export.bench.worker import sample_feeds
    from mha_export.check.runners.ort import OrtRunner
    from mha_export.signature import make_signature
    c = MHAConfig(dim=64, heads=4, max_seq_len=32)
    path = export_onnx(c, tmp_path / "a", static_cache=kind == "static-cache", dtype="float16",
                       validate=False).path
    sig = make_signature(c, kind)
    runner = OrtRunner(sig, path / "model.onnx")
    feeds = sample_feeds({"config": c.to_dict(), "kind": kind, "batch": 2, "seq": 3, "past": 4})
    step = runner.resident_step(feeds)
    assert step() is None and step() is None
    np.testing.assert_allclose(runner.run(feeds)["y"], runner.run(feeds)["y"])


def test_presets_are_published_shapes_and_given_options_win():
    from mha_export.presets import PRESETS, preset_options
    assert preset_options("llama3-8b")["dim"] == 4096 and preset_options(None) == {}
    assert {"llama3-8b", "qwen2.5-7b", "deepseek-v2-lite"} <= set(PRESETS)
    with pytest.raises(UsageError, match="unknown preset"):
        preset_options("gpt-5")


@pytest.mark.parametrize("args, message", [
    (["--preset", "gpt-5"], "Invalid value for '--preset'"),
    (["--preset", "llama3-8b", "--weights", "x.gguf", "--layer", "0"], "not with an artifact"),
])
def test_bad_presets_are_one_line_exit_2(args, message):
    r = CliRunner().invoke(cli, ["bench", *args, "--budget", "0"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("kind, capacity, length", [("static-cache", 8192, 8192),
                                                     ("kv-cache", 0, 4097)])
def test_an_executorch_program_is_bounded_by_the_runs_longest_call(tmp_path, kind, capacity,
                                                                   length):
    """ExecuTorch plans its memory for the longest call its bounds allow: the bench's program
    for one-token steps over an 8192-entry cache plans no 8192-token prefill (it peaked at
    10 GB for 12 x 768 when seq's bound was the capacity)."""
    import dataclasses
    from mha_export.signature import make_signature
    from mha_export.targets.base import BenchRun, Prepared
    from mha_export.targets.executorch import TARGET
    from mha_export.targets.executorch.bench import programs
    asked = []

    def prepare(module, config, sig, **options):
        asked.append((config.max_seq_len, options))
        return Prepared({}, lambda path: path.write_bytes(b""))

    config = MHAConfig(heads=4, dim=64)
    run = BenchRun(config, None, kind, make_signature(config, kind), {}, 1,
                   ((1, 1024), (1, 4096)), capacity, tmp_path)
    out = programs(dataclasses.replace(TARGET, prepare=prepare), run)
    assert asked[0] == (length, {"max_batch": 1, "specs": {}, "kernels": "aten", "max_seq": 1})
    assert out["executorch"] == (tmp_path / "executorch.pte", {})


def test_gpu_rows_are_timed_back_to_back_with_one_sync_per_batch():
    """N calls enqueued, one device sync after them (apps' and the anchors' timing), never a
    sync per call; the host's enqueue time per call beside each batch's time."""
    from mha_export.bench.worker import HostClock, back_to_back
    calls, syncs = [], []
    times, reps, enqueue = back_to_back(lambda: calls.append(1),
                                        HostClock(lambda: syncs.append(len(calls))),
                                        min_reps=5, budget_s=0.01, batches=3)
    assert len(times) == len(enqueue) == 3 and reps == len(calls) - 6  # warm-up, sizing runs
    assert len(syncs) == 2 + 2 * 3 and reps // 3 >= 5
    assert all(0 < e <= t for e, t in zip(enqueue, times))


def test_a_host_bound_gpu_row_is_named():
    """A GPU row whose host took nearly the whole step to enqueue a call times its launches,
    not its kernels: the table says so; a row with room to spare is not named; a row timed by
    the host's clock (its session refused the bench's stream) says so and why."""
    from mha_export.bench.report import BACK_TO_BACK, BenchReport, BenchRow, format_table
    rows = [BenchRow("ort-cuda-graph-auto", 1, 1, 1024, 0.040, 100, timing=BACK_TO_BACK,
                     device="cuda", enqueue_ms=0.038),
            BenchRow("torch-cuda-graph-float16", 1, 1, 1024, 0.120, 100, timing=BACK_TO_BACK,
                     device="cuda", enqueue_ms=0.010, clock="CUDA events"),
            BenchRow("ort-cuda-auto", 1, 1, 1024, 0.150, 100, timing=BACK_TO_BACK,
                     device="cuda", enqueue_ms=0.020, clock="host clock (stream refused)")]
    report = BenchReport({"heads": 2, "dim": 32}, 1, None, {"cpu": "x", "date": "d"}, rows)
    text = format_table(report)
    assert "timed by CUDA events" in text
    assert "host-bound" in text and "ort-cuda-graph-auto past 1024 (38 of 40 us)" in text
    assert "torch-cuda-graph-float16 past 1024 (" not in text
    assert "ort-cuda-auto past 1024: timed by the host clock (stream refused)" in text


def test_cuda_specs_replay_beside_torchs_graph_and_name_their_timing(tmp_path):
    """With a GPU: every CUDA row back to back; torch's own step replayed as a CUDA graph in
    the same run (the anchor); a row records the kernels its runner named."""
    from mha_export.bench.driver import ON_GPU, variant_specs
    c = MHAConfig(dim=32, heads=2)
    models = {"torchscript": tmp_path / "m.pt", "auto": tmp_path / "m.onnx"}
    specs = variant_specs(c, ["auto"], models, ["cpu", "cuda"], True, "static-cache",
                          dtype="float16", cuda_graph=True)
    gpu = {s["name"]: s for s in specs if s.get("back_to_back")}
    assert {"ort-cuda-auto", "ort-cuda-graph-auto", "torch-cuda-sdpa-float16",
            "torch-cuda-graph-float16"} <= set(gpu)
    assert gpu["torch-cuda-graph-float16"]["cuda_graph"] and ON_GPU["back_to_back"]
    assert not any(s.get("back_to_back") for s in specs if s.get("name", "").startswith(
        "ort-cpu"))


def test_a_runner_row_keeps_the_kernels_its_runner_named():
    report = run_bench(MHAConfig(dim=32, heads=4, kv_heads=2), seq_lens=[4], providers=["cpu"],
                       forms=["contrib-gqa"], budget_s=0.01)
    row = next(r for r in report.rows if r.variant == "ort-cpu-contrib-gqa")
    assert row.kernels.startswith("attention: GroupQueryAttention, the CPU provider's")
    from mha_export.bench.report import format_table
    assert f"kernels ort-cpu-contrib-gqa: {row.kernels}" in format_table(report)


def test_event_clock_brackets_the_calls_on_their_stream(monkeypatch):
    """A GPU row's time is the device's between two CUDA events recorded on the stream the
    calls run on: the first after the stream is idle, the second after the N calls were
    enqueued (no sync between calls), read once the second has completed."""
    import torch
    from mha_export.bench.worker import EventClock, back_to_back
    log = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = None

        def record(self, stream):
            log.append(("record", stream.name))
            self.at = len([e for e in log if e == "call"])

        def synchronize(self):
            log.append("event-sync")

        def elapsed_time(self, end):  # ms: one per call between the two events
            return float(end.at - self.at)

    class Stream:
        name = "bench"

        def synchronize(self):
            log.append("stream-sync")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    times, reps, _ = back_to_back(lambda: log.append("call"), EventClock(Stream()), min_reps=4,
                                  budget_s=0.0, batches=2)
    assert times == [1.0, 1.0] and reps == 8  # 1 ms per call, N = min_reps
    batch = log[log.index("event-sync") + 1:]  # after the sizing run
    assert batch[:2] == ["stream-sync", ("record", "bench")]
    assert batch[2:6] == ["call"] * 4 and batch[6:8] == [("record", "bench"), "event-sync"]


def test_a_variant_that_refuses_the_stream_is_timed_by_the_host_clock(monkeypatch):
    """A session that cannot be opened on the bench's stream still gets its row, timed by the
    host's clock around a device sync, and the row says so with the refusal's words."""
    import contextlib
    import torch
    from mha_export.bench import worker

    class Stream:
        cuda_stream = 1234

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing: None)

    def make(spec):
        if "compute_stream" in spec:
            raise RuntimeError("user_compute_stream is not supported here\nmore")
        return lambda: None
    _, result = worker._on_own_stream(make, {"min_reps": 3, "budget_s": 0.0})
    assert result["clock"] == "host clock (user_compute_stream is not supported here)"
    assert result["reps"] == 15 and result["enqueue_ms"] <= result["median_ms"]
