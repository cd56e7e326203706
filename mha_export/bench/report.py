"""A bench run's results and their views: the terminal table, a Markdown table for the docs, the
plot. Torch-free; reads a saved JSON back (`bench --from-json`), older runs' files included."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from ..errors import UsageError

BASELINE = "sdpa-eager"  # eager SDPA; in cached runs eager torch's growing-cache step
BACK_TO_BACK = "device-resident, back to back"  # a GPU row's timing (driver.ON_GPU)


@dataclass
class BenchRow:
    variant: str
    seq: int
    batch: int
    past: int = 0
    median_ms: Optional[float] = None
    reps: int = 0
    tokens_per_s: Optional[float] = None
    gflops: Optional[float] = None
    ceiling_fraction: Optional[float] = None
    speedup_vs_sdpa: Optional[float] = None
    peak_rss_mib: Optional[float] = None
    peak_device_mib: Optional[float] = None  # torch CUDA variants only
    error: str = ""
    bandwidth_gbs: Optional[float] = None  # cached steps: weights + valid cache read per second
    model_mib: Optional[float] = None  # the model file's size (ONNX variants)
    ring: int = 1  # cold runs: independent instances stepped in turn (see bench --cold)
    # what median_ms times: "device-resident" (inputs and outputs bound on the GPU, nothing
    # copied) or "" (as the runner's check calls it: from and to host arrays)
    timing: str = ""
    copies_median_ms: Optional[float] = None  # a device-resident row's call fed from the host
    device: str = "cpu"  # where the variant computes ("cuda": its floor is the GPU's)
    kernels: str = ""  # which kernels ran its attention and MatMulNBits (ONNX Runtime rows)
    # GPU rows: the host's time to enqueue one call; near median_ms the GPU waited on the host
    enqueue_ms: Optional[float] = None
    clock: str = ""  # GPU rows: "CUDA events", or the host clock and why

    @property
    def call(self) -> str:
        """The measured call: a prefill of T tokens, or T tokens over a cache of P."""
        what = f"T={self.seq}" if not self.past else (
            f"past {self.past}" if self.seq == 1 else f"T={self.seq}, past {self.past}")
        return what if self.batch == 1 else f"batch {self.batch}, {what}"


@dataclass
class BenchReport:
    config: dict
    threads: int
    gemm_ceiling_gflops: Optional[float]
    machine: dict
    rows: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    copy_bandwidth_gbs: Optional[float] = None  # cached steps: this run's memory ceiling
    device_copy_bandwidth_gbs: Optional[float] = None  # the same on the GPU (CUDA rows' floor)
    stream_bandwidth_gbs: Optional[float] = None  # cold runs: streaming read of the ring's size
    command: str = ""  # the command line that made it (runs before the docs site: empty)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def decode(self) -> bool:
        """Single-token steps over a cache: read against the past length, not T."""
        return bool(self.rows) and all(r.seq == 1 and r.past for r in self.rows)

    @classmethod
    def load(cls, path: str | Path) -> "BenchReport":
        try:
            data = json.loads(Path(path).read_text())
            known = {f.name for f in fields(BenchRow)}
            rows = [BenchRow(**{k: v for k, v in r.items() if k in known}) for r in data["rows"]]
            head = {f.name for f in fields(cls)} - {"rows"}
            return cls(rows=rows, **{k: v for k, v in data.items() if k in head})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not a bench JSON ({type(e).__name__}: {e})") from None


def step_mib(row: BenchRow) -> Optional[float]:
    """A cached step's bytes read (weights + valid cache), in MiB."""
    if row.bandwidth_gbs is None or row.median_ms is None:
        return None
    return row.bandwidth_gbs * 1e9 * row.median_ms / 1e3 / 2**20


def floor_fraction(report: BenchReport, row: BenchRow) -> Optional[float]:
    """How close a cached step came to its bytes floor: the bandwidth it reached over this
    run's copy bandwidth (read + write traffic, the machine's memory ceiling measured in the
    same run). 1 = the step took no longer than reading its bytes at that rate."""
    ceiling = report.device_copy_bandwidth_gbs if row.device == "cuda" else \
        report.copy_bandwidth_gbs
    if row.bandwidth_gbs is None or not ceiling:
        return None
    return row.bandwidth_gbs / ceiling


def format_table(report: BenchReport) -> str:
    copies = any(r.copies_median_ms for r in report.rows)
    head = ("variant", "T", "P", "median ms", "tokens/s", "GFLOP/s", "% GEMM", "x SDPA",
            "MiB/step", "GB/s", "% floor", "peak MiB") + (("+copies ms",) if copies else ())
    cells = {id(r): (r.variant + ("*" if r.timing else ""), str(r.seq), str(r.past),
                     _num(r.median_ms, ".3f" if r.median_ms < 1 else ".2f"),
                     _num(r.tokens_per_s, ",.0f"), _num(r.gflops, ".0f"),
                     _pct(r.ceiling_fraction), _times(r.speedup_vs_sdpa),
                     _num(step_mib(r), ",.1f"), _num(r.bandwidth_gbs, ".1f"),
                     _pct(floor_fraction(report, r)), _num(r.peak_rss_mib, ",.0f"))
             + ((_num(r.copies_median_ms, ".3f"),) if copies else ())
             for r in report.rows if not r.error}
    widths = [max(len(row[i]) for row in [head, *cells.values()]) for i in range(len(head))]

    def line(row: tuple) -> str:
        return "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in
                         enumerate(zip(row, widths)))

    lines = [line(head), "-" * sum(w + 2 for w in widths)]
    for r in report.rows:
        lines.append(line(cells[id(r)]) if not r.error else
                     f"{r.variant.ljust(widths[0])}  {str(r.seq).rjust(widths[1])}  "
                     f"{str(r.past).rjust(widths[2])}  {r.error}")
    m = report.machine
    if report.gemm_ceiling_gflops:
        lines.append(f"GEMM ceiling {report.gemm_ceiling_gflops:.0f} GFLOP/s (best ONNX Runtime "
                     f"fp32 MatMul 4096^3, before and after); {report.threads} threads; "
                     f"{m['cpu']}; {m['date']}")
    if report.copy_bandwidth_gbs:
        lines.append(f"copy bandwidth {report.copy_bandwidth_gbs:.1f} GB/s (256 MiB numpy copy, "
                     "read + write, best run); MiB/step = weights + valid cache read per step, "
                     "GB/s = those bytes over the step's time, % floor = GB/s over the copy "
                     "bandwidth (100% = at the bytes floor)")
    if report.stream_bandwidth_gbs:
        lines.append(f"cold: each row steps a ring of independent instances (weights + buffers "
                     f"> 3 x the last-level cache); streaming read of that size (numpy sum, one "
                     f"thread) {report.stream_bandwidth_gbs:.1f} GB/s (best run)")
    if any(r.timing for r in report.rows):
        lines.append("* device-resident: inputs, cache and outputs bound on the GPU, nothing "
                     "copied per call (torch's CUDA rows too); +copies ms: the call as the "
                     "check makes it (numpy inputs copied in and outputs read back each call; a "
                     "static cache uploaded once, its whole buffer read back each call)")
    lines += gpu_timing_lines(report)
    if report.device_copy_bandwidth_gbs:
        lines.append(f"GPU copy bandwidth {report.device_copy_bandwidth_gbs:.0f} GB/s (1 GiB "
                     "device-to-device torch copy, read + write, best run): CUDA rows' % floor")
    lines += kernel_lines(report)
    if any(r.variant.endswith("-nomempattern") for r in report.rows):
        lines.append("*-auto-nomempattern: auto with ONNX Runtime's memory-pattern planner off "
                     "(it over-reserves around the blocked loop), measured beside auto")
    sizes = {r.variant: r.model_mib for r in report.rows if r.model_mib}
    if sizes:
        lines.append("model file: " + ", ".join(f"{v} {m:.2f} MiB" for v, m in sizes.items()))
    return "\n".join(lines + report.notes)


# a GPU row whose host took this share of its step to enqueue a call is timed by its launches
HOST_BOUND = 0.9


def gpu_timing_lines(report: BenchReport) -> list[str]:
    """How the GPU rows were timed; the rows whose host enqueued a call in nearly the step's
    whole time (the GPU waited on the host: the row times the launches, not the kernels); the
    rows timed by the host's clock, and why."""
    if not any(r.timing == BACK_TO_BACK for r in report.rows):
        return []
    lines = ["GPU rows: N calls enqueued back to back on the bench's own stream (ONNX Runtime's "
             "user_compute_stream; no host sync per call: disable_synchronize_execution_"
             "providers), timed by CUDA events on that stream, over N; cold: a ring of layers "
             "(own weights) > 3 x the GPU's L2"]
    bound = [f"{r.variant} {r.call} ({1e3 * r.enqueue_ms:.0f} of {1e3 * r.median_ms:.0f} us)"
             for r in report.rows if r.enqueue_ms and r.median_ms
             and r.enqueue_ms >= HOST_BOUND * r.median_ms]
    if bound:
        lines.append(f"host-bound (enqueuing a call took >= {HOST_BOUND:.0%} of the step: the "
                     f"GPU waited on the host): {', '.join(bound)}")
    return lines + [f"{r.variant} {r.call}: timed by the {r.clock}" for r in report.rows
                    if r.clock.startswith("host clock")]


def kernel_lines(report: BenchReport) -> list[str]:
    """One line per variant whose runner said which kernels ran (ONNX Runtime's rows)."""
    kernels = {r.variant: r.kernels for r in report.rows if r.kernels}
    return [f"kernels {v}: {k}" for v, k in kernels.items()]


def markdown_table(report: BenchReport, source: str = "") -> str:
    """One row per measured call, one column per variant: median ms (× the baseline), the peak
    RSS under it; then the run's machine, date, versions and ``source`` (the JSON's path)."""
    variants = list(dict.fromkeys(r.variant for r in report.rows))
    resident = {r.variant for r in report.rows if r.timing}
    calls = list(dict.fromkeys(r.call for r in report.rows))
    cell = {(r.call, r.variant): _markdown_cell(r) for r in report.rows}
    lines = ["| call | " + " | ".join(f"`{v}`" + ("\\*" if v in resident else "")
                                      for v in variants) + " |",
             "|---" * (len(variants) + 1) + "|"]
    lines += [f"| {c} | " + " | ".join(cell.get((c, v), "–") for v in variants) + " |"
              for c in calls]
    return "\n".join(lines) + "\n\n" + _caption(report, source)


def _markdown_cell(r: BenchRow) -> str:
    if r.error:
        return "out of memory" if "memory" in r.error.lower() else "error"
    ms = f"{r.median_ms:.3g}" if r.median_ms < 1000 else f"{r.median_ms:,.0f}"
    ratio = "" if r.variant == BASELINE or r.speedup_vs_sdpa is None else \
        f" ({r.speedup_vs_sdpa:.2f}×)"
    gbs = "" if r.bandwidth_gbs is None else f", {r.bandwidth_gbs:.0f} GB/s"
    rss = "" if r.peak_rss_mib is None else f"<br>{r.peak_rss_mib:,.0f} MiB"
    return f"{ms} ms{ratio}{rss}{gbs}"


def _caption(report: BenchReport, source: str) -> str:
    m, c = report.machine, report.config
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()
                         if k in ("torch", "onnxruntime-gpu", "openvino"))
    kv_heads = c.get("kv_heads", c["heads"])
    layer = f"{c['heads']} heads × {c['dim']}" + (
        f" ({kv_heads} kv heads)" if kv_heads != c["heads"] else "")
    parts = [layer, f"{report.threads} threads", f"{m['cpu']}, {m['date']}", m.get("gpu", ""),
             versions]
    if report.gemm_ceiling_gflops:
        parts.append(f"GEMM ceiling {report.gemm_ceiling_gflops:.0f} GFLOP/s")
    if report.copy_bandwidth_gbs:
        parts.append(f"copy bandwidth {report.copy_bandwidth_gbs:.1f} GB/s")
    if report.device_copy_bandwidth_gbs:
        parts.append(f"GPU copy bandwidth {report.device_copy_bandwidth_gbs:.0f} GB/s")
    if report.stream_bandwidth_gbs:
        parts.append(f"cold (a ring of instances > 3 × the last-level cache), streaming read "
                     f"(one thread) {report.stream_bandwidth_gbs:.1f} GB/s")
    if any(r.timing for r in report.rows):
        parts.append("\\* device-resident: inputs, cache and outputs bound on the GPU, nothing "
                     "copied per call")
    if report.command:
        parts.append(f"`{report.command}`")
    if source:
        parts.append(f"`{source}`")
    return "<small>" + "; ".join(p for p in parts if p) + "</small>"


def _num(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _times(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def plot(report: BenchReport, path: str | Path) -> None:
    """Latency and peak memory per variant, log-log, against T (prefill) or the past length
    (single-token decode steps)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    x_of, x_label = ((lambda r: r.past), "past length P (one token per step)") if report.decode \
        else ((lambda r: r.seq), "sequence length T")
    for v in dict.fromkeys(r.variant for r in report.rows):
        rows = [r for r in report.rows if r.variant == v and r.median_ms]
        if rows:
            ax_t.plot([x_of(r) for r in rows], [r.median_ms for r in rows], "o-", label=v)
            ax_m.plot([x_of(r) for r in rows], [r.peak_rss_mib / 1024 for r in rows], "o-",
                      label=v)
    c = report.config
    for ax, label in ((ax_t, "median latency (ms)"), (ax_m, "peak RSS (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    batch = report.rows[0].batch if report.rows else 1
    fig.suptitle(f"causal MHA {c['heads']}x{c['dim']}, batch {batch}"
                 f", {report.threads} threads, {report.machine['cpu']} ({report.machine['date']})",
                 fontsize=9)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
