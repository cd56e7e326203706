"""transformers as the reference of a layer's calls: the hidden states each call of an attention
module receives and what it returns, over a full forward or a prefill + single-token steps with
the model's own cache (shared by the checkpoint and MLA tests)."""
from __future__ import annotations

import torch


def capture(attn: torch.nn.Module, residual: bool = False):
    """A hook recording every call's (input hidden states, attention output) of ``attn``; the
    list it fills and the hook's handle. ``residual``: the module adds its second argument to
    what it returns (BLOOM's dropout_add), subtracted here."""
    calls = []

    def hook(module, args, kwargs, out):
        x = kwargs.get("hidden_states", args[0] if args else None)
        y = out[0] - kwargs.get("residual", args[1]) if residual else out[0]
        calls.append((x.detach().clone().numpy(), y.detach().clone().numpy()))
    return calls, attn.register_forward_hook(hook, with_kwargs=True)


def decode(model, attn: torch.nn.Module, ids, mask, pos, prefill: int, residual: bool = False):
    """Prefill ``prefill`` tokens, then single-token steps with the model's own cache: the
    layer's calls and the model's final cache."""
    calls, handle = capture(attn, residual)
    with torch.no_grad():
        cache = model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill],
                      position_ids=pos[:, :prefill], use_cache=True).past_key_values
        for t in range(prefill, ids.shape[1]):
            cache = model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                          position_ids=pos[:, t:t + 1], past_key_values=cache,
                          use_cache=True).past_key_values
    handle.remove()
    return calls, cache
