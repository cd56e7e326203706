"""GPT-2's attention with Conv1D weights, and a GPT-2 style full state dict: test fixtures."""
import math

import torch


def gpt2_attention(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, n_head):
    """GPT-2's attention with Conv1D weights stored [in, out]: y = x @ W + b."""
    b, t, d = x.shape
    q, k, v = (x @ c_attn_w + c_attn_b).split(d, dim=2)
    def heads(z):
        return z.view(b, t, n_head, d // n_head).transpose(1, 2)
    q, k, v = heads(q), heads(k), heads(v)
    w = (q @ k.transpose(-1, -2)) / math.sqrt(d // n_head)
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
    w = torch.where(keep, w, torch.finfo(w.dtype).min).softmax(-1)
    ctx = (w @ v).transpose(1, 2).reshape(b, t, d)
    return ctx @ c_proj_w + c_proj_b


def gpt2_checkpoint(n_layer, d, n_head, seed=0, prefix="transformer."):
    """A GPT-2 style full state dict (Conv1D orientation, mask buffers, other weights)."""
    g = torch.Generator().manual_seed(seed)
    sd = {f"{prefix}wte.weight": torch.randn(50, d, generator=g)}
    for i in range(n_layer):
        p = f"{prefix}h.{i}."
        sd[p + "ln_1.weight"] = torch.ones(d)
        sd[p + "attn.bias"] = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
        sd[p + "attn.masked_bias"] = torch.tensor(-1e4)
        sd[p + "attn.c_attn.weight"] = torch.randn(d, 3 * d, generator=g) * 0.1
        sd[p + "attn.c_attn.bias"] = torch.randn(3 * d, generator=g) * 0.1
        sd[p + "attn.c_proj.weight"] = torch.randn(d, d, generator=g) * 0.1
        sd[p + "attn.c_proj.bias"] = torch.randn(d, generator=g) * 0.1
        sd[p + "mlp.c_fc.weight"] = torch.randn(d, 4 * d, generator=g)
    return sd
