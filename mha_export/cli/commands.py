"""Command line: a thin click layer over mha_export's Python API.

Exit codes: 0 success, 1 parity failure, 2 bad input (one line on stderr, no traceback),
3 nothing here could check it (no runner under test ran), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM): an interrupted run never reads as a verdict, and an interrupted export
leaves no staging folder behind.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import shlex
import signal
import sys
import traceback
from typing import Callable, Optional

import click

from .. import __version__
from ..check.parity import FAIL, UNCHECKED, check_parity
from ..check.sweep import SWEEPS, require_past
from ..env import quiet_libraries
from ..errors import Interrupted, UsageError, interrupt, raise_if_interrupted
from ..export.pipeline import ATTENTION_FORMS, export_to
from ..graph.model import DTYPES
from ..signature import INT8
from ..lossy.int8_cache.codes import CACHE_DTYPES
from ..check.runners import RUNNERS
from ..targets.base import ExportTarget
from ..targets.registry import TARGETS
from ..presets import PRESETS, preset_options
from ..check.runners.ort_threads import DEFAULT as DEFAULT_THREAD_POOL, POLICIES as THREAD_POLICIES
from ..address import address_key
from .options import (CHECK_EXITS, VERDICT_EXIT, address_list, budget_options, config_options,
                      explicit, export_options, fanout_options, fanout_settings, int_list,
                      model_options, output_file, provider_list, runner_list)


class BadInput(click.ClickException):
    exit_code = 2


def _guard(fn: Callable) -> Callable:
    """Turn UsageError/OSError into 'Error: ...' + exit 2, and hide library chatter unless -v."""

    @functools.wraps(fn)
    def wrapper(*args, verbose: bool = False, **kwargs):
        if not verbose:
            quiet_libraries()
        if "verbose" in inspect.signature(fn).parameters:  # check prints every row with -v
            kwargs["verbose"] = verbose
        try:
            return fn(*args, **kwargs)
        except UsageError as e:
            if verbose and e.__cause__ is not None:  # a library's failure inside a stage
                traceback.print_exception(e.__cause__)
            raise BadInput(str(e)) from None
        except OSError as e:
            raise BadInput(f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")) from None

    return click.option("-v", "--verbose", is_flag=True,
                        help="Show library warnings and a library's trace (check: and every "
                             "sweep row); one layer's, not with a layers folder.")(wrapper)


def _report_export(result) -> None:
    click.echo(f"wrote {result.path}/ ({', '.join(sorted(p.name for p in result.path.iterdir()))})")
    if result.report is not None:
        from ..check.report import format_report
        click.echo(format_report(result.report))
        exit_on(result.report)


def exit_on(report) -> None:
    """A check's verdict as the exit code (VERDICT_EXIT): 0 returns."""
    if code := VERDICT_EXIT[report.verdict]:
        raise SystemExit(code)


def _export(target: str, kw: dict, verbose: bool) -> None:
    """One artifact, or with --layers every chosen layer of the checkpoint (fanout/)."""
    layers, resume = kw.pop("layers"), kw.pop("resume")
    if layers is None:
        if resume:
            raise UsageError("--resume needs --layers")
        fanout_settings(kw, "--layers")
        sweep = check_sweep(kw)
        options = export_options(kw)
        options["check_options"] = {**sweep, "progress": _progress}
        _report_export(export_to(target, **options))
        return
    refuse_verbose_layers(verbose)
    sweep = check_sweep(kw)
    settings, options = fanout_settings(kw, ""), export_options(kw)
    weights, output = options.pop("weights", None), options.pop("output", None)
    missing = [what for what, given in (
        ("--weights (a checkpoint folder or a .gguf file)", weights),
        ("-o DIR (the folder of every layer's artifact and layers.json)", output))
        if given is None]
    if missing:
        raise UsageError(f"--layers needs {' and '.join(missing)}")
    if options.pop("layer", None) is not None:
        raise UsageError("--layer and --layers: pass one")
    from ..fanout import export_layers
    summary = export_layers(target, weights, layers, output, resume=resume,
                            force=options.pop("force", False),
                            validate=options.pop("validate", True), progress=_layers_progress,
                            check_options=sweep, **settings, **options)
    _report_layers(summary, output)


def refuse_verbose_layers(verbose: bool) -> None:
    """-v shows this process's library warnings, a library's trace and a check's every row: a
    fan-out's layers run in workers of their own, each summed up in its layers.json row."""
    if verbose:
        raise UsageError("-v shows one layer's library warnings and every check row; a layers "
                         "folder keeps each layer's rows in its layer-N/parity.json: run one "
                         "layer (--layer N, or check DIR/layer-N) with -v")


def check_sweep(kw: dict) -> dict:
    """The export commands' --seq-lens / --batch-sizes / --past-lens: the check's sweep, as
    check takes it (only those given); with --no-check there is no sweep to narrow."""
    sweep = {k: v for k in ("seq_lens", "batch_sizes", "past_lens", "sweep")
             if (v := kw.pop(k, None)) is not None}
    require_past(sweep.get("past_lens"), bool(kw.get("kv_cache") or kw.get("static_cache")))
    if sweep and not kw.get("validate", True):
        raise UsageError("--seq-lens, --batch-sizes, --past-lens and --sweep choose the "
                         "check's cases: not with --no-check")
    return sweep


def _layers_progress(summary, running: int, record) -> None:
    """Layers done / running / failed: a live line on a terminal, a line per layer in a log."""
    counts = summary.counts()
    failed = sum(n for status, n in counts.items() if status not in ("pass", "exported"))
    done = len(summary.records)
    if sys.stderr.isatty():
        click.echo(f"\r\033[K[{done}/{summary.planned} layers] {running} running, "
                   f"{failed} failed", err=True, nl=False)
    elif record is not None:
        click.echo(f"[{done}/{summary.planned}] layer {record.layer}: {record.status} "
                   f"({record.seconds:.1f} s) {record.message}".rstrip(), err=True)


def _report_layers(summary, folder: str, json_path: Optional[str] = None) -> None:
    from ..artifact import write_json_atomic
    from ..fanout import format_summary
    if sys.stderr.isatty():
        click.echo("\r\033[K", err=True, nl=False)
    if json_path:
        write_json_atomic(json_path, summary.to_dict())
    click.echo(format_summary(summary))
    click.echo(f"wrote {folder}/layers.json")
    if not summary.passed:
        raise SystemExit(VERDICT_EXIT[UNCHECKED if summary.unchecked else FAIL])


def _progress(i: int, n: int, label: str) -> None:
    """Sweep progress on stderr, only when it is a terminal."""
    if sys.stderr.isatty():
        click.echo(f"\r\033[K[{i}/{n}] {label}" if i < n else "\r\033[K", err=True, nl=False)


def _lossy_options(fn: Callable) -> Callable:
    """The lossy steps' options: --quantize, --block-size, ..., --kv-cache-dtype, ... (the
    export commands' own)."""
    from .options import LOSSY_OPTIONS
    for option in reversed(LOSSY_OPTIONS):
        fn = option(fn)
    return fn


def given(*names: str) -> list[str]:
    """Which of the command's parameters ``names`` the user set (not left at their defaults),
    as they are spelt on the command line."""
    ctx = click.get_current_context()
    spelt = {p.name: p.opts[0] if p.opts[0].startswith("-") else p.name.upper()
             for p in ctx.command.params}
    default = click.core.ParameterSource.DEFAULT
    return [spelt[n] for n in names if ctx.get_parameter_source(n) not in (None, default)]


def require_extra(module: str, extra: str, flag: str) -> None:
    """An optional dependency checked before any work: one line naming the extra to install."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{flag} needs {module}: pip install 'mha-export[{extra}]'") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mha-export")
def cli() -> None:
    """Export causal multi-head attention to ONNX, TorchScript, AOTInductor (aoti) or
    ExecuTorch, and prove parity with eager PyTorch.

    \b
    mha-export onnx --heads 12 --dim 768          # -> models/split-h12-d768-onnx/
    mha-export check models/split-h12-d768-onnx   # CI: exit 0 pass, 1 parity failure, 2 bad input,
                                                  # 3 nothing here could check it
    """


def _export_command(target: ExportTarget) -> click.Command:
    """The target's command: the model's options, then its own (its record's), its help."""
    def command(verbose: bool, **kw) -> None:
        if target.notice:
            click.echo(f"note: {target.notice}", err=True)
        _export(target.name, kw, verbose)

    fn = _guard(command)
    for option in reversed(target.options):
        fn = option.click_option()(fn)
    return cli.command(target.name, help=target.summary)(model_options(fn))


for _target in TARGETS.values():
    _export_command(_target)


@cli.command(epilog=f"Exit codes: {CHECK_EXITS}; a layers folder: 0 when every layer "
                    "passed, 3 when the others are unchecked, else 1.")
@click.argument("artifact", type=click.Path())
@click.option("--runners", callback=runner_list, default=None,
              help="Runners to check, by name: " + "; ".join(
                  f"{k.name} ({k.runtime})" for k in RUNNERS.values()) + " [default: the "
                  "runners of the file's own runtime (" + "; ".join(
                      ", ".join(k.name for k in RUNNERS.values()
                                if k.by_default and k.model_file == t.model_file)
                      for t in TARGETS.values()) + "), "
                  "SKIPPED with the reason where they cannot run here; the others (OpenVINO, "
                  "ort-cuda-graph) run when named, or beside the runner they accompany, or "
                  "the first that can in their place where none of them can run the file "
                  "here (a bf16 file on a CPU: openvino-cpu), said in one line].")
@click.option("--providers", default=None, callback=provider_list,
              help="ONNX Runtime's shorthand: cpu,cuda = runners ort-cpu,ort-cuda.")
@click.option("--atol", type=float, default=None, help="Absolute tolerance for every runner.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for every runner.")
@click.option("--seq-lens", callback=int_list, default=None,
              help="Comma-separated T values [default: 1,2,7,64,100,257,max-1,max,max+1].")
@click.option("--batch-sizes", callback=int_list, default=None,
              help="Comma-separated batch sizes [default: 1,3; a bounded program's: those "
                   "within its bounds].")
@click.option("--past-lens", callback=functools.partial(int_list, lowest=0), default=None,
              help="Cache lengths for --kv-cache / --static-cache models [default: "
                   "0,1,5,max-1]. 0 is allowed.")
@click.option("--sweep", type=click.Choice(SWEEPS), default="full", show_default=True,
              help="full: every batch size x length x cache length; quick (the export-time "
                   "check's): lengths over 64 at batch 1 over the two shortest caches.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              callback=output_file, default=None,
              help="Write the report as JSON.")
@click.option("--require-cuda", is_flag=True,
              help="Fail (exit 1) when the CUDA provider cannot run, instead of skipping it.")
@click.option("--tf32/--no-tf32", default=True, show_default=True,
              help="Allow TF32 on ORT CUDA; --no-tf32 checks CUDA with the strict fp32 tolerance.")
@budget_options
@click.option("--inputs", type=click.Path(dir_okay=False), default=None,
              help="Real layer inputs (a file from `mha-export capture`): the artifact's "
                   "layer's captured input added as real cases (labelled so), with the lossy "
                   "steps' costs on them reported apart.")
@fanout_options
@_guard
def check(artifact: str, json_path: Optional[str], verbose: bool, **kw) -> None:
    """Check an artifact folder against eager PyTorch rebuilt from its config and source weights.

    \b
    Examples:
      mha-export check models/split-h12-d768-onnx
      mha-export check out/gpt2-l3 --providers cpu --seq-lens 1,5,300 --json parity.json
      mha-export check out/gpt2-l3 --require-cuda --no-tf32
      mha-export check out/ts --runners torchscript
      mha-export check models/split-h12-d768-int4-onnx --max-quant-error 0.05
      mha-export check models/split-h12-d768-static-kv8-onnx --max-clip-rate 0.001
      mha-export check models/smollm2-l5 --inputs models/smollm2-inputs.safetensors
      mha-export check out/smollm2 --executor ray   # every layer-N/ in it: layers.json
    """
    from ..fanout import check_layers, is_layers_folder
    if is_layers_folder(artifact):  # a folder of layer folders (onnx --layers ... -o DIR)
        refuse_verbose_layers(verbose)
        settings = fanout_settings(kw, "")
        summary = check_layers(artifact, progress=_layers_progress, **settings, **kw)
        _report_layers(summary, artifact, json_path)
        return
    fanout_settings(kw, "a folder of layer folders (onnx --layers ... -o DIR)")
    from ..artifact import read_artifact
    from ..check.report import format_report
    require_past(kw.get("past_lens"), read_artifact(artifact).signature.follows_past)
    report = check_parity(artifact, progress=_progress, **kw)
    if json_path:
        from ..artifact import write_json_atomic
        write_json_atomic(json_path, report.to_dict())
    click.echo(format_report(report, verbose))
    exit_on(report)


@cli.command()
@click.option("--weights", required=True, type=click.Path(),
              help="The whole model: a Hugging Face checkpoint folder or a .gguf file "
                   "(run by transformers: pip install 'mha-export[model]').")
@click.option("--text", "text_path", required=True, type=click.Path(dir_okay=False),
              help="A UTF-8 text file, tokenized with the checkpoint tokenizer's defaults.")
@click.option("--layers", required=True, callback=address_list,
              help="Comma-separated layer addresses whose attention input to keep (3.1: "
                   "layer 3's module 1, where layers hold several: longcat_flash).")
@click.option("--tokens", type=click.IntRange(min=8), default=512, show_default=True,
              help="Tokens per sequence (the text's first ones).")
@click.option("--sequences", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sequences of --tokens each, one after another in the text.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The .safetensors file to write (layers.{L}.x, token_ids).")
@_guard
def capture(weights: str, text_path: str, layers: list, tokens: int, sequences: int,
            output: str) -> None:
    """Capture real attention inputs: each layer's input on a real text.

    Runs the whole model (transformers) over the text and keeps, for each of --layers, what
    its attention module receives (the hidden states after the layer's input norm), float32
    [sequences, tokens, d_in]: real cases for `check --inputs` and scales for
    `--calibration`.

    \b
    Examples:
      mha-export capture --weights SmolLM2-135M-Instruct.Q4_1.gguf --text licence.txt \\
          --layers 0,5,29 --tokens 512 -o models/smollm2-inputs.safetensors
    """
    from ..model.capture import capture_text, write_capture
    result = capture_text(weights, text_path, layers, tokens, sequences)
    path = write_capture(result, output)
    shapes = ", ".join(f"layers.{layer}.x {list(x.shape)}"
                       for layer, x in sorted(result.inputs.items(),
                                              key=lambda item: address_key(item[0])))
    click.echo(f"wrote {path} ({shapes})")


# eval's runners: ONNX Runtime's and OpenVINO's CPU ones, and each other target's CPU runner
EVAL_RUNNERS = ("ort-cpu", "ort-cpu-fp32-compute", "openvino-cpu", "openvino-cpu-fp32-compute",
                *(k.name for t in TARGETS.values() for k in t.runners if k.device == "cpu"))


def _eval_target_options(fn: Callable) -> Callable:
    """The export targets' options `eval` takes (their records' ``in_eval``): every layer's,
    with a runner of that target's file."""
    from ..targets.registry import eval_options
    for target, option in reversed(eval_options()):
        runners = ", ".join(k.name for k in RUNNERS.values() if k.model_file == target.model_file
                            and k.name in EVAL_RUNNERS)
        fn = option.click_option(f"{target.title}, --runner {runners}: ")(fn)
    return fn


@cli.command("eval")
@click.option("--weights", required=True, type=click.Path(),
              help="The whole model: a Hugging Face checkpoint folder or a .gguf file "
                   "(transformers: pip install 'mha-export[model]').")
@click.option("--text", "text_path", required=True, type=click.Path(dir_okay=False),
              help="A UTF-8 text; its first --tokens tokens (the tokenizer's defaults).")
@click.option("--tokens", type=click.IntRange(min=8), default=256, show_default=True)
@click.option("--layers", default="all", show_default=True,
              help="Layers whose attention runs exported: all, or comma-separated indices.")
@click.option("--runner", default="ort-cpu", show_default=True,
              type=click.Choice(EVAL_RUNNERS),
              help="What runs each layer's artifact (a torch program is compiled or lowered "
                   "per layer first: ~20-30 s a layer).")
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True,
              help="Where the exported layers run: cuda runs --runner's CUDA counterpart "
                   "(ort-cpu: ort-cuda, onnxruntime-gpu); refused in one line where no CUDA "
                   "session starts.")
@click.option("--generate", type=click.IntRange(min=0), default=0, show_default=True,
              help="Greedy tokens after the text, each step through the decode artifacts "
                   "(a growing cache unless --static-cache), against eager's.")
@click.option("--thread-pool", type=click.Choice(list(THREAD_POLICIES)),
              default=DEFAULT_THREAD_POOL, show_default=True,
              help="How the layers' ONNX Runtime sessions share the cores: idle = each "
                   "session's threads sleep after a run; shared = one process-wide pool; spin "
                   "= ONNX Runtime's default (threads spin after a run, starving the next "
                   "layer and torch).")
@_eval_target_options
@click.option("--kv-cache", is_flag=True, help="Export decode artifacts (a growing cache).")
@click.option("--static-cache", is_flag=True,
              help="Export decode artifacts over a static buffer written in place.")
@click.option("--exports", "folder", type=click.Path(file_okay=False), default=None,
              help="Keep the artifacts here (reused by a later run with the same options; a "
                   "checked `onnx --layers ... -o DIR` folder's passing layers are reused "
                   "too) [default: a temporary folder].")
@click.option("--attribute", is_flag=True,
              help="Also run each lossy step alone and together: fp32 export, the weights "
                   "(fp32 compute), + int8 activations (level 4), the int8 cache.")
@click.option("--per-layer", is_flag=True,
              help="Also run the options with one layer exported at a time.")
@click.option("--max-kl", type=float, default=None,
              help="Fail (exit 1) when the mean per-token KL(eager || exported) exceeds this.")
@click.option("--min-top1", type=float, default=None,
              help="Fail (exit 1) when the share of positions whose argmax agrees is lower.")
@click.option("--max-ppl-increase", type=float, default=None,
              help="Fail (exit 1) when perplexity rises by more than this fraction (0.001 = "
                   "0.1%).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              callback=output_file, default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              callback=output_file, default=None,
              help="A PNG of the per-token KL (and of each attribution step).")
@_lossy_options
@_guard
def eval_(weights: str, text_path: str, tokens: int, layers: str, runner: str, device: str,
          generate: int, folder: Optional[str], attribute: bool, per_layer: bool,
          max_kl: Optional[float], min_top1: Optional[float], max_ppl_increase: Optional[float],
          json_path: Optional[str], plot_path: Optional[str], thread_pool: str,
          **kw) -> None:
    """Evaluate exported attention layers inside the real model.

    Exports each chosen layer with the given options, runs the text eagerly and with those
    layers' attention computed by their artifacts (the rest of the model eager), and reports
    perplexity, top-1 agreement and KL(eager || exported) per token, greedy generation's
    agreement, each layer's own deviation, and (--attribute) each lossy step's share.

    \b
    Examples:
      mha-export eval --weights SmolLM2-135M-Instruct.Q4_1.gguf --text licence.txt
      mha-export eval --weights model.gguf --text t.txt --quantize int8 --accuracy-level 4 \\
          --attribute --max-kl 0.01 --json eval.json --plot kl.png
    """
    from ..model.eval import evaluate
    from ..model.report import format_evaluation, plot_evaluation
    from ..check.runners import on_device
    runner = on_device(runner, device)
    refuse_unused_eval_options(runner)
    if plot_path:
        require_extra("matplotlib", "plot", "--plot")
    options = export_options(kw)
    result = evaluate(weights, text_path, tokens, layers, runner, generate, options, folder,
                      attribute, per_layer, max_kl, min_top1, max_ppl_increase,
                      progress=_progress, thread_pool=thread_pool)
    if json_path:
        from ..artifact import write_json_atomic
        write_json_atomic(json_path, result.to_dict())
    if plot_path:
        plot_evaluation(result, plot_path)
    click.echo(format_evaluation(result))
    if not result.passed:
        raise SystemExit(1)


def refuse_unused_eval_options(runner: str) -> None:
    """eval's options that its --runner would not use, each a one-line refusal."""
    if not runner.startswith("ort-") and given("thread_pool"):
        raise UsageError(f"--thread-pool shares ONNX Runtime's threads: --runner {runner} "
                         "opens no ONNX Runtime session")
    if RUNNERS[runner].model_file != "model.onnx" and given("attention"):
        raise UsageError(f"--attention is the ONNX file's graph form: --runner {runner} runs "
                         f"{RUNNERS[runner].model_file}")


@cli.command()
@click.argument("artifact", type=click.Path(), required=False)
@config_options
@click.option("--seq-lens", callback=int_list, default="128,512,2048,8192,16384",
              show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--kv-cache", is_flag=True,
              help="Measure the decode-step models: eager forward_step vs every cache-capable "
                   "form.")
@click.option("--static-cache", is_flag=True,
              help="Measure the in-place static-cache models (buffer of --capacity entries) "
                   "against eager torch's growing-cache step.")
@click.option("--capacity", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Static cache buffer capacity.")
@click.option("--runners", "extra_runners", callback=runner_list, default=None,
              help="More runners to measure beside eager, TorchScript and ONNX Runtime: "
                   "openvino-cpu (every form), " + ", ".join(
                       f"{k.name} ({k.model_file}: {t.title})" for t in TARGETS.values()
                       if t.name not in ("onnx", "torchscript") for k in t.runners
                       if k.device == "cpu") + ".")
@click.option("--cpp", "cpp_folder", type=click.Path(file_okay=False), default=None,
              help="Also time the C++ programs of this `make cpp` folder (e.g. build/cpp) on the "
                   "same files, no Python per call: " + ", ".join(
                       f"{t.cpp_program} ({t.title})" for t in TARGETS.values()
                       if t.cpp_program) + " (with a runner of its file among --runners).")
@click.option("--past-lens", callback=functools.partial(int_list, lowest=0), default="0",
              show_default=True, help="Cache lengths with --kv-cache (e.g. --seq-lens 1 "
                                      "--past-lens 128,1024,4096 for single-token steps).")
@click.option("--providers", default="cpu,cuda", show_default=True, callback=provider_list,
              help="ONNX Runtime providers to measure (CUDA rows only where a GPU runs them).")
@click.option("--forms", default=None,
              help="ONNX graph forms to measure [default: all; with --kv-cache, those with a "
                   "cache].")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads for torch and ONNX Runtime.")
@click.option("--budget", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds of timed runs per measurement (at least 3-5 runs).")
@click.option("--mem-limit-gib", type=click.FloatRange(min=1), default=16.0, show_default=True,
              help="Address-space cap per measurement process (over it: 'out of memory').")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              callback=output_file, default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              callback=output_file, default=None,
              help="PNG: latency and memory vs T (vs the past length for decode steps), "
                   "log-log.")
@click.option("--from-json", "from_json", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Measure nothing: show a saved run (--json) again, with "
                                 "--markdown or --plot.")
@click.option("--markdown", is_flag=True,
              help="Print the results as the Markdown table of the docs' performance page.")
@click.option("--quantize", "quantize_names", default=None,
              help="Also measure every ONNX form with quantized projections: int4, int8 "
                   "(round to nearest, block 32, symmetric), source (a .gguf's own blocks, "
                   "with --weights FILE.gguf --layer N) or several (int4,int8; source,int4).")
@click.option("--accuracy-level", "accuracy_levels", default=None, callback=int_list,
              help="With --quantize: MatMulNBits accuracy levels to measure (4 = int8 "
                   "activations, 1 = fp32), e.g. 1,4 [default: each quantizer's export default: "
                   "4 for int4/int8, 1 for source].")
@click.option("--kv-cache-dtype", "kv_cache_dtype", type=click.Choice(CACHE_DTYPES),
              default="float", show_default=True,
              help="With --static-cache: int8 = also measure every form that builds it with an "
                   "int8 cache (scales calibrated on synthetic inputs), with each --quantize.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
              help="A deployment-sized layer by name (its published shape; options given "
                   "here win): " + ", ".join(PRESETS) + ".")
@click.option("--cold", is_flag=True,
              help="Each row steps a ring of independent instances (own weights and buffers) "
                   "larger than the last-level cache, as the layers of a real model evict each "
                   "other; beside a streaming read of that size.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="The ONNX models' and torch's dtype (float16 / bfloat16: what GPUs run).")
@click.option("--cuda-graph", is_flag=True,
              help="--static-cache on CUDA: each model's step also replayed as a CUDA graph "
                   "(runner ort-cuda-graph).")
@_guard
def bench(artifact: Optional[str], json_path: Optional[str], plot_path: Optional[str],
          from_json: Optional[str], markdown: bool, preset: Optional[str],
          **kw) -> None:
    """Measure eager PyTorch (textbook and SDPA), TorchScript and every ONNX graph form side by
    side, each measurement in its own process (peak RSS per variant). CUDA rows time the call
    with its buffers on the device (device-resident), the host copies in a column apart.

    \b
    Examples:
      mha-export bench --heads 12 --dim 768 --json bench.json --plot bench.png
      mha-export bench models/split-h12-d768-onnx --seq-lens 128,2048 --forms attention-op,blocked
      mha-export bench --kv-cache --seq-lens 1 --past-lens 128,1024,4096 --batch 8
      mha-export bench --static-cache --seq-lens 1 --past-lens 128,1024,4096,8000
      mha-export bench --static-cache --seq-lens 1 --past-lens 128,1024 --forms auto \\
          --quantize int4,int8 --cold
      mha-export bench --static-cache --seq-lens 1 --past-lens 1024,4096 --forms auto \\
          --quantize int4 --kv-cache-dtype int8
      mha-export bench --weights model.Q4_1.gguf --layer 5 --static-cache --seq-lens 1 \\
          --past-lens 128,1024,4096 --forms auto --quantize source,int4
      mha-export bench --preset llama3-8b --static-cache --seq-lens 1 --past-lens 1024 \\
          --forms auto --quantize int4,int8 --cold
      mha-export bench --preset llama3-8b --static-cache --seq-lens 1 --past-lens 1024,8192 \\
          --providers cuda --dtype float16 --cuda-graph
      mha-export bench --from-json bench.json --markdown --plot bench.png
    """
    if plot_path:
        require_extra("matplotlib", "plot", "--plot")
    run = {name: kw.pop(name) for name in BENCH_RUN_OPTIONS}  # kw: the layer's options
    refuse_unused_bench_options(artifact, from_json, run, preset, kw)
    from ..bench.report import BenchReport
    if from_json:
        _show_bench(BenchReport.load(from_json), from_json, markdown, plot_path)
        return
    from ..bench.driver import run_bench
    source, plan = _bench_plan(artifact, run, kw, preset)
    report = run_bench(source.config, plan, weights_module=source.module,
                       progress=lambda line: click.echo(line, err=True))
    if json_path:
        from ..artifact import write_json_atomic
        write_json_atomic(json_path, report.to_dict())
    _show_bench(report, json_path or "", markdown, plot_path)


# bench's options that say what the run measures (the others describe the layer)
BENCH_RUN_OPTIONS = ("seq_lens", "batch", "kv_cache", "static_cache", "capacity", "past_lens",
                     "providers", "threads", "mem_limit_gib", "cold", "dtype", "cuda_graph",
                     "extra_runners", "cpp_folder", "quantize_names", "accuracy_levels",
                     "forms", "kv_cache_dtype", "budget")


def _bench_plan(artifact: Optional[str], run: dict, config_fields: dict,
                preset: Optional[str]) -> tuple:
    """(the layer measured, the run's BenchPlan) from bench's options: ``run`` (what it
    measures, BENCH_RUN_OPTIONS) and ``config_fields`` (the layer's)."""
    from ..bench.plan import (BenchPlan, cpp_folder, forms_named, layer_measured,
                              quantization_named)
    runners = run.pop("extra_runners") or ()
    cpp = cpp_folder(run.pop("cpp_folder"), runners)
    if run["cold"] and cpp:
        raise UsageError("--cold steps a ring of instances in Python: not with --cpp")
    quantize = quantization_named(run.pop("quantize_names"), run.pop("accuracy_levels"))
    forms = forms_named(run.pop("forms"), ATTENTION_FORMS)
    int8, budget = run.pop("kv_cache_dtype") == INT8, run.pop("budget")
    layer = {k: config_fields.pop(k) for k in ("weights", "layer", "seed")}
    source, quantize, int8 = layer_measured(
        artifact, {**layer, **explicit(config_fields, preset_options(preset))}, quantize, int8)
    return source, BenchPlan(**run, budget_s=budget, forms=forms, seed=layer["seed"],
                             runners=runners, cpp=cpp, quantize=quantize, int8_cache=int8,
                             command=shlex.join(["mha-export", *sys.argv[1:]]))


def refuse_unused_bench_options(artifact: Optional[str], from_json: Optional[str], run: dict,
                                preset: Optional[str], config_fields: dict) -> None:
    """bench's options that the run would not use, each a one-line refusal (``run``: what it
    measures, BENCH_RUN_OPTIONS; ``config_fields``: the layer's)."""
    cached, static_cache = run["kv_cache"] or run["static_cache"], run["static_cache"]
    quantize = run["quantize_names"]
    if preset and (artifact or config_fields.get("weights")):
        raise UsageError("--preset names a layer's shape: not with an artifact or --weights")
    if from_json and (unused := given(*(n for n in click.get_current_context().params
                                        if n not in ("from_json", "markdown", "plot_path",
                                                     "verbose")))):
        raise UsageError(f"--from-json shows a saved run, measuring nothing: {unused[0]} is "
                         "not used with it")
    if artifact and (unused := given(*(n for n in config_fields if n != "seed"))):
        raise UsageError(f"ARTIFACT's own layer is measured: {unused[0]} describes another "
                         "(not with an artifact)")
    for flag, needs, unused in (
            ("--past-lens", "--kv-cache or --static-cache", not cached and given("past_lens")),
            ("--capacity", "--static-cache", not static_cache and given("capacity")),
            ("--accuracy-level", "--quantize", quantize is None and given("accuracy_levels"))):
        if unused:
            raise UsageError(f"{flag} is not used without {needs}")


def _show_bench(report, source: str, markdown: bool, plot_path: Optional[str]) -> None:
    """The run as the terminal table (or the docs' Markdown table), and its plot."""
    from ..bench.report import format_table, markdown_table, plot
    click.echo(markdown_table(report, source) if markdown else format_table(report))
    if plot_path:
        plot(report, plot_path)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    try:
        try:
            code = cli.main(standalone_mode=False)
        except (click.ClickException, SystemExit):
            raise_if_interrupted()  # a runtime's error that was really an interruption
            raise
        raise_if_interrupted()
    except Interrupted as e:
        click.echo("interrupted" if e.signum == signal.SIGINT else "terminated", err=True)
        sys.exit(e.exit_code)
    except click.UsageError as e:  # one line, as every other bad input (docs/cli.md)
        where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        click.echo(f"Error: {e.format_message()}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:  # click's form of a KeyboardInterrupt raised by other code
        click.echo("interrupted", err=True)
        sys.exit(128 + signal.SIGINT)
    sys.exit(code if isinstance(code, int) else 0)
