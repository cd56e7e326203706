"""Small quantized Hugging Face checkpoints for the tests, written as the formats' own writers
write them, and each format's reference dequantization, written apart from the product's
decoders (torch bit operations, the formats' definitions):

- GPTQ: AutoGPTQ's pack (qweight: 32 / bits codes a word along the inputs; qzeros along the
  outputs; v1 stores zero - 1 per field), GPTQModel's decoder ((field + 1) mod 2^bits for v1);
- AWQ: AutoAWQ's GEMM pack (field i of a word holds output 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]) and
  its dequantize_gemm;
- compressed-tensors: its own compressors and decompressors (compressed-tensors 0.20);
- FP8 blocks: DeepSeek-V3's weight_dequant definition.

Every writer starts from a float checkpoint saved by transformers (test_checkpoints._plain) and
replaces its attention projections."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# --- the formats' reference dequantizations (torch) ------------------------------------------

def _unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, C) int32 -> (R * 32 / bits, C): word r's field j is row r * (32 / bits) + j."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    fields = (words.to(torch.int64)[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
    return fields.reshape(-1, words.shape[1])


def _unpack_cols(words: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, C) int32 -> (R, C * 32 / bits): word c's field j is column c * (32 / bits) + j."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    fields = (words.to(torch.int64)[:, :, None] >> shifts[None, None, :]) & ((1 << bits) - 1)
    return fields.reshape(words.shape[0], -1)


def gptq_reference(t: dict, bits: int, v1: bool) -> torch.Tensor:
    """(N, K) float32: W = (q - z[g_idx]) * s[g_idx], zero points (field + 1) mod 2^bits in v1."""
    q = _unpack_rows(t["qweight"], bits)  # (K, N)
    s = t["scales"].float()  # (G, N)
    z = _unpack_cols(t["qzeros"], bits)[:, : s.shape[1]]
    if v1:
        z = (z + 1) % (1 << bits)
    g = t["g_idx"].long()
    return ((q - z[g]).float() * s[g]).t().contiguous()


def awq_reference(t: dict, group: int) -> torch.Tensor:
    """(N, K) float32, as AutoAWQ's dequantize_gemm: unpack, undo the order, (q - z) * s."""
    reverse = torch.tensor([AWQ_ORDER.index(i) for i in range(8)])
    q, z = _unpack_cols(t["qweight"], 4), _unpack_cols(t["qzeros"], 4)
    cols = (torch.arange(q.shape[1]) // 8) * 8
    q = q[:, cols + reverse[torch.arange(q.shape[1]) % 8]]
    z = z[:, cols + reverse[torch.arange(z.shape[1]) % 8]]
    s = t["scales"].float().repeat_interleave(group, 0)[: q.shape[0]]
    z = z.repeat_interleave(group, 0)[: q.shape[0]]
    return ((q - z).float() * s).t().contiguous()


def fp8_reference(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple) -> torch.Tensor:
    """DeepSeek-V3's weight_dequant: W[i, j] = q[i, j] * s[i // rows, j // cols]."""
    n, k = weight.shape
    s = scale_inv.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return weight.float() * s


# --- writers --------------------------------------------------------------------------------

def _groups(w: torch.Tensor, g_idx: torch.Tensor, n_groups: int, bits: int, sym: bool):
    """Per (group, output) scale (fp16) and zero point of w (N, K), and the codes (K, N)."""
    top = (1 << bits) - 1
    scales = torch.empty(n_groups, w.shape[0])
    zeros = torch.empty(n_groups, w.shape[0], dtype=torch.int64)
    for g in range(n_groups):
        cols = w[:, g_idx == g]
        if sym:
            s = cols.abs().amax(1).clamp(min=1e-6) / ((top + 1) // 2 - 1)
            z = torch.full_like(s, (top + 1) // 2, dtype=torch.int64)
        else:
            lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
            s = ((hi - lo) / top).clamp(min=1e-6)
            z = torch.round(-lo / s.half().float()).clamp(0, top).long()
        scales[g], zeros[g] = s.half().float(), z
    q = torch.round(w.t() / scales[g_idx]) + zeros[g_idx]  # (K, N)
    return scales.half(), zeros, q.clamp(0, top).long()


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    per = 32 // bits
    v = values.reshape(-1, per, values.shape[1])
    word = sum(v[:, j].to(torch.int64) << (bits * j) for j in range(per))
    return torch.from_numpy(word.numpy().astype(np.uint32).view(np.int32))


def _pack_cols(values: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    per = 32 // bits
    v = values.reshape(values.shape[0], -1, per)
    if order is not None:  # field i holds column ORDER[i] of its word's eight
        v = v[:, :, order]
    word = sum(v[:, :, j].to(torch.int64) << (bits * j) for j in range(per))
    return torch.from_numpy(word.numpy().astype(np.uint32).view(np.int32))


def gptq_tensors(w: torch.Tensor, bits: int, group: int, sym: bool, act_order: bool,
                 v1: bool, seed: int = 0) -> dict:
    n, k = w.shape
    group = k if group <= 0 else group
    n_groups = -(-k // group)
    if act_order:  # g_idx[perm[i]] = i // group: the inputs quantized in the order perm
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(k))
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[perm] = (torch.arange(k) // group).int()
    else:
        g_idx = (torch.arange(k) // group).int()
    scales, zeros, q = _groups(w, g_idx.long(), n_groups, bits, sym)
    stored = (zeros - 1) % (1 << bits) if v1 else zeros  # v1: zero - 1, per field
    pad = -n % (32 // bits)
    stored = torch.nn.functional.pad(stored, (0, pad))
    return {"qweight": _pack_rows(q, bits), "qzeros": _pack_cols(stored, bits),
            "scales": scales, "g_idx": g_idx}


def awq_tensors(w: torch.Tensor, group: int) -> dict:
    n, k = w.shape
    g_idx = torch.arange(k) // group
    scales, zeros, q = _groups(w, g_idx, -(-k // group), 4, sym=False)
    return {"qweight": _pack_cols(q, 4, AWQ_ORDER), "qzeros": _pack_cols(zeros, 4, AWQ_ORDER),
            "scales": scales}


def fp8_tensors(w: torch.Tensor, block: tuple) -> dict:
    n, k = w.shape
    rows, cols = -(-n // block[0]), -(-k // block[1])
    scale = torch.empty(rows, cols)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            scale[i, j] = tile.abs().max().clamp(min=1e-6) / 448.0
    full = scale.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return {"weight": (w / full).to(torch.float8_e4m3fn), "weight_scale_inv": scale}


def compressed_tensors(w: torch.Tensor, args: dict, fmt: str) -> dict:
    """The module's tensors as compressed-tensors' own compressor writes them."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams
    qargs = QuantizationArgs(**args)
    scheme = QuantizationScheme(targets=["Linear"], weights=qargs)
    n, k = w.shape
    if qargs.strategy == "group":
        g = qargs.group_size
        tiles = [w[:, i:i + g] for i in range(0, k, g)]
        lo = torch.stack([t.amin(1) for t in tiles], 1)
        hi = torch.stack([t.amax(1) for t in tiles], 1)
    elif qargs.strategy == "block":
        r, c = qargs.block_structure
        lo = torch.stack([torch.stack([w[i:i + r, j:j + c].amin() for j in range(0, k, c)])
                          for i in range(0, n, r)])
        hi = torch.stack([torch.stack([w[i:i + r, j:j + c].amax() for j in range(0, k, c)])
                          for i in range(0, n, r)])
    else:  # channel
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    scale, zero = calculate_qparams(lo, hi, qargs)
    state = {"weight": w, "weight_scale": scale}
    if not qargs.symmetric:
        state["weight_zero_point"] = zero
    return dict(BaseCompressor.load_from_registry(fmt).compress(state, scheme))


def compressed_reference(tensors: dict, args: dict, fmt: str) -> torch.Tensor:
    """compressed-tensors' own decompression, its scales in float32 (exact)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    state = {k: (v.float() if k == "weight_scale" else v) for k, v in tensors.items()}
    return BaseCompressor.load_from_registry(fmt).decompress(state, scheme)["weight"].float()


# --- a checkpoint folder --------------------------------------------------------------------

def quantized_folder(base: Path, out: Path, qcfg: dict, quantize,
                     projections: tuple[str, ...] = PROJECTIONS) -> dict[str, torch.Tensor]:
    """``base`` (a float folder) with every layer's attention ``projections`` replaced by
    ``quantize(name, weight) -> tensors`` and config.json's quantization_config set; returns
    the float weights it started from, by full name."""
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(base / "model.safetensors"))
    floats = {}
    for name in [n for n in state if n.endswith(".weight") and
                 n.split(".")[-2] in projections and ".self_attn." in n]:
        w = state.pop(name).float()
        floats[name] = w
        module = name[: -len(".weight")]
        state.update({f"{module}.{part}": t for part, t in quantize(module, w).items()})
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    cfg = json.loads((base / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(cfg))
    return floats
