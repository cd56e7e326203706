"""The benchmark's plumbing (speed itself is measured by `mha-export bench`, never asserted)."""
import json

import pytest

from click.testing import CliRunner

from mha_export import MHAConfig
from mha_export.bench.driver import effective_flops, run_bench
from mha_export.cli.commands import cli


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
