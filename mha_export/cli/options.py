"""The CLI's shared options and their parsers (cli.py holds the commands)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Optional

import click

from ..check.runners import RUNNERS, ort_runner_names
from ..config import (LAYOUTS, QK_NORMS, ROPE_LAYOUTS, ROTARY, SCALINGS, SECTIONS,
                      MHAConfig)
from ..errors import UsageError
from ..lossy.costs import BUDGETS
from ..weights.families import FAMILIES
from ..lossy.int8_cache.codes import CACHE_DTYPES, GRANULARITIES, VALUE_SCALE
from ..lossy.projections.rtn import ACCURACY_LEVELS, BLOCK_SIZES, NAMES, QuantSpec
from ..lossy.projections.source import SOURCE, SourceQuantSpec

# The layer's defaults are MHAConfig's: the CLI shows them, never re-declares them.
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(MHAConfig)}


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
    click.option("--qk-norm-eps", type=float, default=DEFAULTS["qk_norm_eps"], show_default=True),
    click.option("--norm-offset", type=float, default=DEFAULTS["norm_offset"], show_default=True,
                 help="The q/k norm multiplies by (offset + weight): 1 for Gemma 3, Qwen3.5."),
    click.option("--softmax-scale", type=float, default=None,
                 help="Softmax scale [default: 1/sqrt(head_dim)] (Gemma: query_pre_attn_scalar"
                      "^-0.5, Granite: attention_multiplier)."),
    click.option("--softcap", type=float, default=None,
                 help="Logit softcapping cap*tanh(s/cap), before the mask (Gemma 2)."),
    click.option("--sinks/--no-sinks", default=DEFAULTS["sinks"], show_default=True,
                 help="A learned logit per head joins the softmax denominator (gpt-oss)."),
    click.option("--output-gate/--no-output-gate", default=DEFAULTS["output_gate"],
                 show_default=True, help="y = out_proj(attention * sigmoid(x W_gate)) (Qwen3.5)."),
    click.option("--sliding-window", type=int, default=None,
                 help="Query i sees key j only when i - j < N (Mistral) [default: no window]."),
    click.option("--layout", type=click.Choice(LAYOUTS), default=None,
                 help="Weight layout [default: the weights file's, else split; latent with "
                      "--kv-lora-rank]."),
    *(click.option(f"--{name.replace('_', '-')}", type=int, default=None, help=text)
      for section in SECTIONS.values() for name, text in section.cli_options().items()),
    click.option("--weights", type=click.Path(), default=None,
                 help="State dict (.pt/.pth/.bin) or .safetensors in any layout's keys, or a "
                      f"Hugging Face checkpoint folder ({', '.join(FAMILIES)})."),
    click.option("--layer", type=int, default=None,
                 help="Which layer's attention in a full checkpoint."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed for random weights (without --weights)."),
]
ARTIFACT_OPTIONS = [
    click.option("-o", "--output", "output", type=click.Path(file_okay=False), default=None,
                 help="Artifact folder [default: models/<layout>-h<heads>-d<dim>-<format>]."),
    click.option("--force", is_flag=True, help="Replace an existing artifact folder."),
    click.option("--check/--no-check", "validate", default=True, show_default=True,
                 help="Run the parity check on the new artifact."),
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

QUANT_DEFAULT = QuantSpec()
QUANT_OPTIONS = [
    click.option("--quantize", type=click.Choice((*NAMES, SOURCE)), default=None,
                 help="Weight-only quantized projections (q/k/v, output, gate) as ONNX Runtime's "
                      "MatMulNBits, round to nearest per block; norms, biases and sinks stay "
                      "float (ONNX only); source: a .gguf checkpoint's own blocks, kept as "
                      "they are (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K) [default: float "
                      "weights]."),
    click.option("--block-size", type=click.Choice([str(b) for b in BLOCK_SIZES]),
                 default=str(QUANT_DEFAULT.block_size), show_default=True,
                 help="Input features per quantization block (one scale each)."),
    click.option("--symmetric/--asymmetric", default=QUANT_DEFAULT.symmetric, show_default=True,
                 help="Symmetric blocks, or a zero point per block."),
    click.option("--accuracy-level", type=click.Choice([str(a) for a in ACCURACY_LEVELS]),
                 default=str(QUANT_DEFAULT.accuracy_level), show_default=True,
                 help="MatMulNBits' arithmetic: " + ", ".join(
                     f"{a} = {c}" for a, c in ACCURACY_LEVELS.items()) + " (faster, looser)."),
]


KV_OPTIONS = [
    click.option("--kv-cache-dtype", type=click.Choice(CACHE_DTYPES), default="float",
                 show_default=True,
                 help="With --static-cache: int8 = the buffers hold int8 codes, quantized on "
                      "write with static scales (round half to even, clipped) and dequantized "
                      "on read (ONNX only; docs/kv-cache.md)."),
    click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                 help="int8 cache: hidden states [n, T, d_in] (.npy or .safetensors) to "
                      "calibrate the scales on [default: synthetic random inputs, and the "
                      "check's report says so]."),
    click.option("--value-scale", type=click.Choice(tuple(GRANULARITIES)), default=VALUE_SCALE,
                 show_default=True,
                 help="int8 cache: one scale per value channel, or one for all values (keys: "
                      "always per channel)."),
]


def export_options(kw: dict) -> dict:
    """The export API's keywords: the options the user set (``explicit``), the quantization
    ones gathered into ``quantize=QuantSpec`` (given without --quantize: an error)."""
    kw = explicit(kw)
    if "value_scale" in kw and kw.get("kv_cache_dtype") != "int8":
        raise UsageError("--value-scale needs --kv-cache-dtype int8")
    fields = {name: kw.pop(name) for name in ("block_size", "symmetric", "accuracy_level")
              if name in kw}
    name = kw.pop("quantize", None)
    if name is None:
        if fields:
            raise UsageError(f"--{next(iter(fields)).replace('_', '-')} needs --quantize")
        return kw
    for key in ("block_size", "accuracy_level"):
        if key in fields:
            fields[key] = int(fields[key])
    if name == SOURCE:  # the file's own blocks: only the kernel's arithmetic is a choice
        other = next((f for f in fields if f != "accuracy_level"), None)
        if other:
            raise UsageError(f"--{other.replace('_', '-')} does not apply to --quantize source "
                             "(the GGUF file's blocks decide it)")
        return {**kw, "quantize": SourceQuantSpec(**fields)}
    return {**kw, "quantize": QuantSpec.named(name, **fields)}


def explicit(kw: dict) -> dict:
    """Only the options the user set: defaults stay the API's, and a Hugging Face checkpoint's
    config.json fills what was not given (a given value that contradicts it is an error)."""
    ctx = click.get_current_context()
    default = click.core.ParameterSource.DEFAULT
    return sections({k: v for k, v in kw.items() if ctx.get_parameter_source(k) is not default})


def sections(kw: dict) -> dict:
    """The options of each attention kind's section (e.g. MLA's, which --kv-lora-rank turns on)
    gathered into MHAConfig's field of that section."""
    for field, section in SECTIONS.items():
        if (given := section.from_options(kw)) is not None:
            kw = {**kw, field: given}
    return kw


def budget_options(fn: Callable) -> Callable:
    """check's --max-* options: each lossy step's budgets (lossy/costs.py)."""
    return _apply([click.option(f"--{name.replace('_', '-')}", type=float, default=None,
                                help=text) for name, text in BUDGETS.items()], fn)


def config_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS, fn)


def model_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS + ARTIFACT_OPTIONS + QUANT_OPTIONS + KV_OPTIONS, fn)
