"""compressed-tensors (quant_method "compressed-tensors"), as llm-compressor writes it (and
compressed-tensors 0.20's compressors, which the tests use to write and to decompress):

    pack-quantized   weight_packed (N, ceil(K * bits / 32)) int32: each row's codes as a dense bit
                     stream, code i at bit i * bits, stored as q + 2^(bits-1) (q signed);
                     weight_scale (N, G) [group, channel: G = 1; tensor: one];
                     weight_zero_point (ceil(N * bits / 32), G) int32, packed the same way along
                     the outputs (asymmetric; since 0.9.4); weight_shape (2,); weight_g_idx (K,)
                     (act-order "group")
                     W[n, k] = (q[n, k] - zp[n, g(k)]) * s[n, g(k)]
    float-quantized  weight (N, K) float8_e4m3fn, weight_scale: per tensor, per channel (N, 1),
                     per group (N, K / group) or per block (ceil(N / r), ceil(K / c))
                     W[n, k] = weight[n, k] * s[...]

A module's scheme is the config group whose targets match it ("Linear", a name, or "re:..."),
its format the group's or the config's. int4 / int8 codes (MatMulNBits' widths) and e4m3.
Activation quantization a scheme may have (W8A8, FP8 dynamic) is not reproduced.
"""
from __future__ import annotations

import re

import numpy as np

from ...errors import UsageError
from .base import (Float8Blocks, IntGroups, QuantFormat, float8_codes, numpy_of, require,
                   unpack_fields)

PACKED, FLOAT = "pack-quantized", "float-quantized"
FORMATS = (PACKED, FLOAT)
INT_BITS = (4, 8)
INT_STRATEGIES = ("tensor", "channel", "group")  # integer codes: a scale per row and group


def _rank(target: str, module: str) -> int | None:
    """How a target matches a module, as compressed-tensors ranks them: 0 its name, 1 a
    "re:" pattern, 2 a class name ("Linear": every projection); None: no match."""
    if target.startswith("re:"):
        return 1 if re.match(target[3:], module) else None
    if module == target or module.endswith("." + target):
        return 0
    return 2 if target == "Linear" else None


def scheme(qcfg: dict, module: str) -> tuple[dict, str]:
    """(the weights' quantization args, the format) of ``module``: the config group whose
    target matches it best (a name, then a pattern, then a class)."""
    found = []
    for group in (qcfg.get("config_groups") or {}).values():
        ranks = [r for r in (_rank(t, module) for t in group.get("targets", [])) if r is not None]
        if ranks:
            found.append((min(ranks), group))
    if not found:
        raise UsageError(f"{module}: quantized tensors but no config group of the folder's "
                         "quantization_config targets it")
    group = min(found, key=lambda f: f[0])[1]
    return group.get("weights") or {}, group.get("format") or qcfg.get("format", "")


def check(qcfg: dict) -> None:
    for name, group in (qcfg.get("config_groups") or {}).items():
        fmt = group.get("format") or qcfg.get("format", "")
        weights = group.get("weights") or {}
        if fmt not in FORMATS:
            raise UsageError(f"compressed-tensors format {fmt!r} (config group {name}) is not "
                             f"read ({', '.join(FORMATS)} are)")
        kind, bits = weights.get("type", "int"), weights.get("num_bits")
        strategy = weights.get("strategy", "tensor")
        if fmt == PACKED and (kind != "int" or bits not in INT_BITS):
            raise UsageError(f"compressed-tensors {kind}{bits} pack-quantized weights (config "
                             f"group {name}) are not kept (int4 and int8 are)")
        if fmt == PACKED and strategy not in INT_STRATEGIES:
            raise UsageError(f"compressed-tensors pack-quantized strategy {strategy!r} (config "
                             f"group {name}) is not kept ({', '.join(INT_STRATEGIES)} are)")
        if strategy == "group" and not isinstance(weights.get("group_size"), int) or \
                strategy == "block" and len(weights.get("block_structure") or []) != 2:
            raise UsageError(f"compressed-tensors config group {name}: strategy {strategy!r} "
                             "without its group_size / block_structure")
        if fmt == FLOAT and (kind != "float" or bits != 8):
            raise UsageError(f"compressed-tensors {kind}{bits} float-quantized weights (config "
                             f"group {name}) are not kept (float8 e4m3 is)")


def decode(parts: dict, qcfg: dict, module: str) -> IntGroups | Float8Blocks:
    weights, fmt = scheme(qcfg, module)
    if fmt == PACKED:
        return _packed(parts, weights, module)
    return _float8(parts, weights, module)


def _packed(parts: dict, args: dict, module: str) -> IntGroups:
    require(parts, ("weight_packed", "weight_scale", "weight_shape"), module, PACKED)
    bits = int(args["num_bits"])
    shape = numpy_of(parts["weight_shape"]).reshape(-1)
    if shape.size != 2:
        raise UsageError(f"{module}.weight_shape is {shape.tolist()}: expected (outputs, inputs)")
    n, k = (int(v) for v in shape)
    codes = unpack_fields(numpy_of(parts["weight_packed"]), bits, axis=1)[:, :k]  # (N, K)
    scales = numpy_of(parts["weight_scale"]).reshape(-1, 1) if parts["weight_scale"].dim() < 2 \
        else numpy_of(parts["weight_scale"])
    scales = np.broadcast_to(scales, (n, scales.shape[1])).copy()  # (N, G)
    g = scales.shape[1]
    zero_point = parts.get("weight_zero_point")
    if zero_point is not None and zero_point.numel() == 1:  # per tensor: one, stored unpacked
        zeros = np.full((n, g), int(zero_point.reshape(-1)[0]) + (1 << (bits - 1)), np.uint8)
    elif zero_point is not None:  # asymmetric: packed along the outputs, offset like codes
        zeros = unpack_fields(numpy_of(zero_point), bits, axis=0)[:n]  # (N, G)
    elif not args.get("symmetric", True):
        raise UsageError(f"{module}.weight_zero_point is missing: the tensors do not match the "
                         "folder's quantization_config (asymmetric)")
    else:
        zeros = np.full((n, g), 1 << (bits - 1), np.uint8)
    group = int(args.get("group_size") or 0) if args.get("strategy") == "group" else k
    groups = (numpy_of(parts["weight_g_idx"]).astype(np.int64) if "weight_g_idx" in parts
              else np.arange(k) // max(group, 1))
    if codes.shape != (n, k) or zeros.shape != (n, g) or group <= 0 or \
            groups.max(initial=0) >= g or groups.min(initial=0) < 0:
        raise UsageError(f"{module}: compressed-tensors tensors of inconsistent shapes "
                         f"(weight_packed {tuple(parts['weight_packed'].shape)}, weight_scale "
                         f"{tuple(parts['weight_scale'].shape)}, weight_shape {(n, k)})")
    return IntGroups("compressed-tensors", bits, group, np.ascontiguousarray(codes),
                     np.ascontiguousarray(zeros), scales, groups)


def _float8(parts: dict, args: dict, module: str) -> Float8Blocks:
    require(parts, ("weight", "weight_scale"), module, FLOAT)
    codes = float8_codes(parts["weight"], module)
    n, k = codes.shape
    scales = numpy_of(parts["weight_scale"])
    strategy = args.get("strategy", "tensor")
    if strategy == "tensor":
        block = (n, k)
    elif strategy == "channel":
        block = (1, k)
    elif strategy == "group":
        block = (1, int(args["group_size"]))
    elif strategy == "block":
        block = tuple(int(v) for v in args["block_structure"])
    else:
        raise UsageError(f"{module}: compressed-tensors float8 strategy {strategy!r} is not kept")
    shape = (-(-n // block[0]), -(-k // block[1]))
    if scales.size != shape[0] * shape[1]:
        raise UsageError(f"{module}.weight_scale has shape {tuple(scales.shape)}: its "
                         f"{strategy} strategy needs {shape}")
    return Float8Blocks("compressed-tensors", codes, scales.reshape(shape).astype(np.float32),
                        block)


def activations(qcfg: dict) -> str:
    """The input activations' quantization a config group names, e.g. "int8 dynamic per token"."""
    for group in (qcfg.get("config_groups") or {}).values():
        act = group.get("input_activations")
        if act:
            how = "dynamic" if act.get("dynamic") else "static"
            return (f"{act.get('type', 'int')}{act.get('num_bits', '')} {how} per "
                    f"{act.get('strategy', 'tensor')}")
    return ""


FORMAT = QuantFormat(
    "compressed-tensors", "compressed-tensors", ("weight_packed", "weight_scale"),
    ("weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
     "weight_g_idx"), decode, check, activations)
