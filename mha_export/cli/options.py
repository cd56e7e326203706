"""The CLI's shared options and their parsers (cli.py holds the commands)."""
from __future__ import annotations

import json
from typing import Callable, Optional

import click

from ..config import LAYOUTS, ROTARY
from ..check.parity import PROVIDERS


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


def provider_list(ctx, param, value: str) -> list[str]:
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in PROVIDERS]
    if bad or not names:
        raise click.BadParameter(f"choose from {', '.join(PROVIDERS)}, got {value!r}")
    return names


def _apply(options: list, fn: Callable) -> Callable:
    for opt in reversed(options):
        fn = opt(fn)
    return fn


CONFIG_OPTIONS = [
    click.option("--heads", type=int, default=12, show_default=True, help="Attention heads."),
    click.option("--dim", type=int, default=768, show_default=True, help="Output width."),
    click.option("--d-in", type=int, default=None, help="Input width [default: dim]."),
    click.option("--head-dim", type=int, default=None,
                 help="Width of one head [default: dim/heads]."),
    click.option("--kv-heads", type=int, default=None,
                 help="Key/value heads, grouped-query attention [default: heads; 1 = multi-query]."),
    click.option("--qkv-bias/--no-qkv-bias", default=False, show_default=True,
                 help="Biases on the q/k/v projections."),
    click.option("--out-bias/--no-out-bias", default=True, show_default=True,
                 help="Bias on the output projection (split/fused)."),
    click.option("--dropout", type=float, default=0.0, show_default=True,
                 help="Attention dropout (training only; exports run in eval mode)."),
    click.option("--max-seq-len", type=int, default=1024, show_default=True,
                 help="Context length; checked by default. Longer inputs also work."),
    click.option("--causal/--no-causal", default=True, show_default=True),
    click.option("--rotary", type=click.Choice(ROTARY), default="none",
                 show_default=True, help="Rotary position embeddings: half = GPT-NeoX/Llama "
                                         "rotate_half, interleaved = GPT-J; adds input position_ids."),
    click.option("--rotary-dim", type=int, default=None,
                 help="Features of each head that rotate (partial rotary) [default: head_dim]."),
    click.option("--rope-theta", type=float, default=10000.0, show_default=True),
    click.option("--rope-scaling", callback=json_object, default=None,
                 help='Rotary frequency scaling as Hugging Face spells it, e.g. '
                      '\'{"rope_type": "linear", "factor": 2}\' (default, linear, llama3).'),
    click.option("--sliding-window", type=int, default=None,
                 help="Query i sees key j only when i - j < N (Mistral) [default: no window]."),
    click.option("--layout", type=click.Choice(LAYOUTS), default=None,
                 help="Weight layout [default: the weights file's, else split]."),
    click.option("--weights", type=click.Path(), default=None,
                 help="State dict (.pt/.pth/.bin) or .safetensors in any layout's keys, or a "
                      "Hugging Face checkpoint folder (gpt2, llama, mistral, qwen2, gpt_neox)."),
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
    click.option("--attention-mask", is_flag=True,
                 help="Full-sequence model with a padding mask: x, attention_mask -> y."),
]


def explicit(kw: dict) -> dict:
    """Only the options the user set: defaults stay the API's, and a Hugging Face checkpoint's
    config.json fills what was not given (a given value that contradicts it is an error)."""
    ctx = click.get_current_context()
    return {k: v for k, v in kw.items()
            if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}


def config_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS, fn)


def model_options(fn: Callable) -> Callable:
    return _apply(CONFIG_OPTIONS + ARTIFACT_OPTIONS, fn)
