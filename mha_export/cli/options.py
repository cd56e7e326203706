"""The CLI's shared options and their parsers (cli.py holds the commands)."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

import click

from ..address import Address, parse_address
from ..check.parity import FAIL, PASS, UNCHECKED
from ..check.runners import RUNNERS, ort_runner_names
from ..check.sweep import SWEEPS
from ..config import (LAYOUTS, QK_NORM_TYPES, QK_NORMS, QUERY_SCALE_BY, ROPE_LAYOUTS, ROTARY,
                      SCALINGS, SECTIONS, MHAConfig)
from ..errors import UsageError
from ..fanout.executors import EXECUTORS
from ..layer_option import declared, flag
from ..lossy.costs import BUDGETS
from ..weights.families import FAMILIES
from ..lossy import registry as lossy

# a check's exit code by its verdict (CheckReport.verdict); 2 is bad input (docs/cli.md)
VERDICT_EXIT = {PASS: 0, FAIL: 1, UNCHECKED: 3}
CHECK_EXITS = (f"{VERDICT_EXIT[PASS]} pass, {VERDICT_EXIT[FAIL]} parity failure, 2 bad "
               f"input, {VERDICT_EXIT[UNCHECKED]} nothing here could check it (no runner under "
               f"test ran: not a pass, not a parity failure)")

# The layer's defaults are MHAConfig's: the CLI shows them, never re-declares them.
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(MHAConfig)}


def layer_address(ctx, param, value: Optional[str]) -> Optional[Address]:
    """--layer: N, or N.M (module M of layer N, where a checkpoint's layers hold several)."""
    if value is None:
        return None
    try:
        return parse_address(value)
    except ValueError:
        raise click.BadParameter(f"expected N or N.M (3, 3.1), got {value!r}") from None


def address_list(ctx, param, value: Optional[str]) -> Optional[list[Address]]:
    """--layers of capture: comma-separated layer addresses (0,5,29; 3.1: layer 3's module 1)."""
    if value is None:
        return None
    try:
        found = [parse_address(v) for v in value.split(",") if v.strip()]
    except ValueError:
        found = []
    if not found:
        raise click.BadParameter(f"expected addresses N or N.M separated by commas (0,5,3.1), "
                                 f"got {value!r}")
    return list(dict.fromkeys(found))


def int_list(ctx, param, value: Optional[str], lowest: int = 1) -> Optional[list[int]]:
    if value is None:
        return None
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not values or min(values) < lowest:
        raise click.BadParameter(f"expected integers >= {lowest}, got {value!r}")
    return values


def json_object(ctx, param, value: Optional[str]) -> Optional[dict]:
    if value is None:
        return None
    try:
        d = json.loads(value)
    except ValueError:
        raise click.BadParameter(f"expected a JSON object, got {value!r}") from None
    if not isinstance(d, dict):
        raise click.BadParameter(f"expected a JSON object, got {value!r}")
    return d


def output_file(ctx, param, value: Optional[str]) -> Optional[str]:
    """A file written when the command is done (--json, --plot): its folder is checked before
    any work, so that a mistyped or unwritable folder is not found after minutes of it."""
    if value is not None:
        folder = Path(value).parent
        if not folder.is_dir():
            raise click.BadParameter(f"folder {folder} not found: create it or choose another")
        if not os.access(folder, os.W_OK):
            raise click.BadParameter(f"folder {folder} is not writable")
    return value


def provider_list(ctx, param, value: Optional[str]) -> Optional[list[str]]:
    """--providers cpu,cuda: ONNX Runtime's execution providers (the runners ort-cpu, ort-cuda)."""
    if value is None:
        return None
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    try:
        ort_runner_names(names)
    except UsageError as e:
        raise click.BadParameter(str(e)) from None
    return names


def runner_list(ctx, param, value: Optional[str]) -> Optional[list[str]]:
    """--runners NAMES: runner names from the registry."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in RUNNERS]
    if bad or not names:
        raise click.BadParameter(f"choose from {', '.join(RUNNERS)}, got {value!r}")
    return names


def _apply(options: list, fn: Callable) -> Callable:
    for opt in reversed(options):
        fn = opt(fn)
    return fn


# the layer options declared on their config field (layer_option.py)
DECLARED_OPTIONS = [click.option(flag(f), type=how.type, default=f.default,
                                 show_default=f.default is not None, help=how.help)
                    for f, how in declared(MHAConfig)]
CONFIG_OPTIONS = [
    click.option("--heads", type=int, default=DEFAULTS["heads"], show_default=True,
                 help="Attention heads."),
    click.option("--dim", type=int, default=DEFAULTS["dim"], show_default=True,
                 help="Output width."),
    click.option("--d-in", type=int, default=None, help="Input width [default: dim]."),
    click.option("--head-dim", type=int, default=None,
                 help="Width of one head [default: dim/heads]."),
    click.option("--kv-heads", type=int, default=None,
                 help="Key/value heads, grouped-query attention [default: heads; "
                      "1 = multi-query]."),
    click.option("--qkv-bias/--no-qkv-bias", default=DEFAULTS["qkv_bias"], show_default=True,
                 help="Biases on the q/k/v projections."),
    click.option("--out-bias/--no-out-bias", default=None,
                 help="Bias on the output projection (split/fused/latent) [default: yes; MLA: "
                      "no, as DeepSeek's]."),
    click.option("--dropout", type=float, default=DEFAULTS["dropout"], show_default=True,
                 help="Attention dropout (training only; exports run in eval mode)."),
    click.option("--max-seq-len", type=int, default=DEFAULTS["max_seq_len"], show_default=True,
                 help="Context length; checked by default. Longer inputs also work."),
    click.option("--causal/--no-causal", default=DEFAULTS["causal"], show_default=True),
    click.option("--rotary", type=click.Choice(tuple(dict.fromkeys(ROTARY + ROPE_LAYOUTS))),
                 default=DEFAULTS["rotary"], show_default=True,
                 help="Rotary position embeddings: half = GPT-NeoX/Llama rotate_half, "
                 "interleaved = GPT-J (and DeepSeek-V2's pairs), deinterleaving = DeepSeek-V3's "
                 "rope_interleave (MLA only, its default); adds input position_ids."),
    click.option("--rotary-dim", type=int, default=None,
                 help="Features of each head that rotate (partial rotary) [default: head_dim]."),
    click.option("--rope-theta", type=float, default=DEFAULTS["rope_theta"], show_default=True),
    click.option("--rope-scaling", callback=json_object, default=None,
                 help='Rotary frequency scaling as Hugging Face spells it, e.g. '
                      '\'{"rope_type": "linear", "factor": 2}\' ' + f"({', '.join(SCALINGS)})."),
    click.option("--qk-norm", type=click.Choice(QK_NORMS), default=DEFAULTS["qk_norm"],
                 show_default=True, help="RMSNorm of q and k before rotary: head = over each "
                 "head's features (Qwen3, Gemma 3), full = over the whole projection (OLMo 2)."),
    click.option("--qk-norm-type", type=click.Choice(QK_NORM_TYPES),
                 default=DEFAULTS["qk_norm_type"], show_default=True,
                 help="rms = RMSNorm; layer = LayerNorm, the mean subtracted first (Phi, "
                      "StableLM, Cohere)."),
    click.option("--qk-norm-bias", is_flag=True, default=False,
                 help="The q/k norm adds a learned bias (Phi's LayerNorm)."),
    click.option("--qk-norm-per-head", is_flag=True, default=False,
                 help="One q/k norm weight per head, (heads, head_dim) (StableLM, Cohere)."),
    click.option("--qk-norm-after-rope", is_flag=True, default=False,
                 help="The q/k norm after rotary, not before (Hunyuan)."),
    click.option("--qk-norm-weightless", is_flag=True, default=False,
                 help="The q/k norm without a weight: x / rms(x) (Llama 4's L2 norm)."),
    click.option("--query-scale-length", type=int, default=None,
                 help="The length of --query-scale-beta (original_max_position_embeddings)."),
    click.option("--query-scale-by", type=click.Choice(QUERY_SCALE_BY), default="position",
                 show_default=True,
                 help="What --query-scale-beta scales by: position (position_ids), or slot: "
                      "floor((cache slot + 1) / length) (Llama 4's temperature tuning)."),
    *DECLARED_OPTIONS,
    click.option("--norm-offset", type=float, default=DEFAULTS["norm_offset"], show_default=True,
                 help="The q/k norm multiplies by (offset + weight): 1 for Gemma 3, Qwen3.5."),
    click.option("--sinks/--no-sinks", default=DEFAULTS["sinks"], show_default=True,
                 help="A learned logit per head joins the softmax denominator (gpt-oss)."),
    click.option("--alibi/--no-alibi", default=DEFAULTS["alibi"], show_default=True,
                 help="ALiBi: head h's score of key j gains slope_h * (j - i); the slopes are "
                      "weights (alibi_slopes), the paper's by default (BLOOM, MPT, Falcon)."),
    click.option("--output-gate/--no-output-gate", default=DEFAULTS["output_gate"],
                 show_default=True, help="y = out_proj(attention * sigmoid(x W_gate)) (Qwen3.5)."),
    click.option("--sliding-window", type=int, default=None,
                 help="Query i sees key j only when i - j < N (Mistral) [default: no window]."),
    click.option("--attention-chunk", type=int, default=None,
                 help="Query i sees keys j <= i of its own chunk of N tokens, counted from its "
                      "row's first token (Llama 4's attention_chunk_size) [default: none]."),
    click.option("--layout", type=click.Choice(LAYOUTS), default=None,
                 help="Weight layout [default: the weights file's, else split; latent with "
                      "--kv-lora-rank]."),
    *(click.option(f"--{name.replace('_', '-')}", type=int, default=None, help=text)
      for section in SECTIONS.values() for name, text in section.cli_options().items()),
    click.option("--weights", type=click.Path(), default=None,
                 help="State dict (.pt/.pth/.bin) or .safetensors in any layout's keys, or a "
                      f"Hugging Face checkpoint folder ({', '.join(FAMILIES)})."),
    click.option("--layer", default=None, callback=layer_address, metavar="N|N.M",
                 help="Which layer's attention in a full checkpoint (N.M: module M of layer N, "
                      "where each layer holds several: longcat_flash)."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed for random weights (without --weights)."),
]
ARTIFACT_OPTIONS = [
    click.option("-o", "--output", "output", type=click.Path(file_okay=False), default=None,
                 help="Artifact folder [default: models/<layout>-h<heads>-d<dim>-<format>]."),
    click.option("--force", is_flag=True,
                 help="Replace a folder mha-export wrote (an artifact or layers folder); any "
                      "other non-empty folder is refused, its files kept."),
    click.option("--check/--no-check", "validate", default=True, show_default=True,
                 help=f"Run the parity check on the new artifact (written whatever its "
                      f"verdict, parity.json saying it); exit codes {CHECK_EXITS}."),
    click.option("--seq-lens", callback=int_list, default=None,
                 help="The check's T values, as check's (to narrow it) [default: check's]."),
    click.option("--batch-sizes", callback=int_list, default=None,
                 help="The check's batch sizes [default: check's, 1,3]."),
    click.option("--past-lens", callback=functools.partial(int_list, lowest=0), default=None,
                 help="The check's cache lengths [default: check's]."),
    click.option("--sweep", type=click.Choice(SWEEPS), default=None,
                 help="The check's sweep: quick (lengths over 64 at batch 1 over the two "
                      "shortest caches) or full, check's [default: quick]."),
    click.option("--kv-cache", is_flag=True,
                 help="Decode-step model: x, attention_mask, past_key, past_value -> y, "
                      "present_key, present_value."),
    click.option("--static-cache", is_flag=True,
                 help="Decode-step model over an app-owned buffer written in place: x, "
                      "past_key, past_value, past_lengths -> y, present_key, present_value "
                      "(bind present to past's memory)."),
    click.option("--attention-mask", is_flag=True,
                 help="Full-sequence model with a padding mask: x, attention_mask -> y."),
]

# the lossy steps' options (--quantize ..., --kv-cache-dtype ...): each step's own (lossy/)
LOSSY_OPTIONS = lossy.options()


def export_options(kw: dict) -> dict:
    """The export API's keywords: the options the user set (``explicit``), each lossy step's
    gathered by it (``quantize=QuantSpec``; a step's option given without it: an error)."""
    return lossy.from_cli(explicit(kw))


def explicit(kw: dict, preset: dict | None = None) -> dict:
    """Only the options the user set: defaults stay the API's, and a Hugging Face checkpoint's
    config.json fills what was not given (a given value that contradicts it is an error).
    ``preset``: a named shape's options (presets.py), under the ones given."""
    ctx = click.get_current_context()
    default = click.core.ParameterSource.DEFAULT
    given = {k: v for k, v in kw.items() if ctx.get_parameter_source(k) is not default}
    return sections({**(preset or {}), **given})


def sections(kw: dict) -> dict:
    """The options of each attention kind's section (e.g. MLA's, which --kv-lora-rank turns on)
    gathered into MHAConfig's field of that section."""
    for field, section in SECTIONS.items():
        if (given := section.from_options(kw)) is not None:
            kw = {**kw, field: given}
    return kw


# every layer of a checkpoint (fanout/): the executor's options, on the export commands and check
LAYERS_OPTIONS = [
    click.option("--layers", "layers", default=None,
                 help="Every layer of the checkpoint (all), a range (0-7) or several (0,5,29; "
                      "3.1: one of a layer's attention modules, longcat_flash): -o DIR gets "
                      "DIR/layer-{L}/ each and DIR/layers.json (docs: layers.md)."),
    click.option("--resume", is_flag=True,
                 help="With --layers: keep the layers DIR already holds passing, made from "
                      "the same options and weights; do the rest."),
]
FANOUT_OPTIONS = [
    click.option("--executor", type=click.Choice(list(EXECUTORS)), default=None,
                 help="What runs the layers: local = a process per layer on this machine; ray "
                      "= a Ray task per layer (pip install 'mha-export[ray]') [default: local]."),
    click.option("--jobs", type=click.IntRange(min=1), default=None,
                 help="local: layers at once [default: as many as the cores and the memory "
                      "allow, from each layer's estimated memory]."),
    click.option("--threads", type=click.IntRange(min=1), default=None,
                 help="Intra-op threads per layer, pinned for torch and every runtime, so "
                      "verdicts do not depend on the executor [default: 1]."),
    click.option("--ray-address", default=None,
                 help="ray: the cluster, host:port (its GCS), ray://host:port or auto (the "
                      "one this machine runs) [default: a private local Ray started for the "
                      "run, never a running cluster joined unasked]; DIR must be a filesystem "
                      "every node sees."),
    click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="Seconds per layer; a layer over it is its 'timeout' row."),
    click.option("--memory-per-layer", type=click.FloatRange(min=0, min_open=True),
                 default=None, help="GiB one layer needs [default: estimated from its shape "
                                    "and the check's sweep]."),
]
FANOUT_KEYS = ("executor", "jobs", "threads", "ray_address", "timeout", "memory_per_layer")


def fanout_settings(kw: dict, where: str) -> dict:
    """The executor's options popped from ``kw``: export_layers' / check_layers' keywords.
    ``where``: what they need, named when they are given without it (None: they may be)."""
    given = {k: kw.pop(k) for k in FANOUT_KEYS}
    if where and any(v is not None for v in given.values()):
        flag = next(k for k, v in given.items() if v is not None).replace("_", "-")
        raise UsageError(f"--{flag} needs {where}")
    memory = given.pop("memory_per_layer")
    return {**{k: v for k, v in given.items() if v is not None},
            **({"memory": int(memory * 2**30)} if memory is not None else {})}


def fanout_options(fn: Callable) -> Callable:
    return _apply(FANOUT_OPTIONS, fn)


def budget_options(fn: Callable) -> Callable:
    """check's --max-* options: each lossy step's budgets (lossy/costs.py)."""
    return _apply([click.option(f"--{name.replace('_', '-')}", type=float, default=None,
                                help=text) for name, text in BUDGETS.items()], fn)


def config_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS, fn)


def model_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS + ARTIFACT_OPTIONS + LOSSY_OPTIONS + LAYERS_OPTIONS
                  + FANOUT_OPTIONS, fn)
