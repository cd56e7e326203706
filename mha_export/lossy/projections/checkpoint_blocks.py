"""A quantized Hugging Face checkpoint's integer weights (weights/quantized: GPTQ, AWQ,
compressed-tensors pack-quantized) as ONNX Runtime's MatMulNBits inputs, exactly: the
checkpoint's codes, one scale and zero point per block, no requantization.

    IntGroups (codes (N, K), zeros and scales (N, G), each input's group)
      -> act-order: the inputs sorted by group (a Gather of x in the graph), so each group is
         a run of consecutive inputs
      -> blocks of the largest power of two (16 .. 128) that divides the group size (a group
         of several blocks repeats its scale and zero point; one group per row: 128, or 32
         for narrow rows), the last block padded with its zero point (a weight of 0)
      -> SourceBlocks: (code - zero point) * scale == the format's own dequantization

Float8 weights need no conversion: kept as they are (kept.py's protocol), the graph writes them
as DequantizeLinear (graph.py). ``kept_form`` picks by the decoded weight's kind.
"""
from __future__ import annotations

import numpy as np

from ...errors import UsageError
from ...weights.quantized import INT_GROUPS, Decoded, IntGroups
from .gguf_blocks import SourceBlocks
from .kept import KeptWeight

BLOCKS = (128, 64, 32, 16)  # MatMulNBits block sizes, the largest that fits first


def block_size(group: int, k: int) -> int:
    """The MatMulNBits block of a group size: one that divides it (its scale repeats per
    block); a single group per row takes any block (the padding is a weight of 0)."""
    if group >= k:
        return 128 if k >= 128 else 32
    fit = next((b for b in BLOCKS if group % b == 0), None)
    if fit is None:
        raise UsageError(f"group size {group} is not a multiple of 16 (MatMulNBits' smallest "
                         "block)")
    return fit


def int_groups_blocks(d: IntGroups) -> SourceBlocks:
    """The exact MatMulNBits form of a decoded integer weight."""
    n, k = d.codes.shape
    order, codes = None, d.codes
    if d.act_order:
        order = np.argsort(d.groups, kind="stable")  # each group's inputs, in their order
        if not np.array_equal(d.groups[order], np.arange(k) // d.group_size):
            raise UsageError(f"{d.format}: act-order groups are not all {d.group_size} inputs "
                             "(g_idx): no exact MatMulNBits form")
        codes = codes[:, order]
    block = block_size(d.group_size, k)
    n_blocks = -(-k // block)
    group_of_block = np.minimum(np.arange(n_blocks) * block // d.group_size,
                                d.scales.shape[1] - 1)  # (n_blocks,)
    zeros, scales = d.zeros[:, group_of_block], d.scales[:, group_of_block]  # (N, n_blocks)
    pad = np.repeat(zeros[:, -1:], n_blocks * block - k, axis=1)  # dequantizes to 0
    codes = np.concatenate([codes, pad], axis=1).reshape(n, n_blocks, block)
    group = "channel" if d.group_size >= k else f"g{d.group_size}"
    name = f"{d.format}-int{d.bits}-{group}" + ("-act-order" if order is not None else "")
    return SourceBlocks(name, d.bits, block, k, np.ascontiguousarray(codes, np.uint8),
                        np.ascontiguousarray(scales, np.float32),
                        np.ascontiguousarray(zeros, np.uint8), input_order=order)


KEPT_FORMS = {INT_GROUPS: int_groups_blocks}  # a decoded weight's kind -> its kept form


def kept_form(decoded: Decoded) -> KeptWeight:
    """The kept weight of a decoded one: its conversion, or itself (float8)."""
    convert = KEPT_FORMS.get(decoded.kind)
    return decoded if convert is None else convert(decoded)
