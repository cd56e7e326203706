"""ALiBi's per-head slopes (Press et al.), without torch (the families read them for a
checkpoint's layer): the paper's geometric sequence as BLOOM and Falcon compute it, and MPT's
variant. The layer adds slope_h * (j - i) to head h's score of query i and key j: the
transformers models add slope_h * j (a position from the row's first token, or from the end),
which differs per query by a constant that the softmax removes."""
from __future__ import annotations

import math


def geometric_slopes(heads: int) -> list[float]:
    """BLOOM's and Falcon's ``build_alibi_tensor``: 2^(-8i/n) for the n = largest power of two
    <= heads, then every other slope of the 2n sequence for the heads beyond it."""
    closest = 2 ** math.floor(math.log2(heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** (2 * i + 1) for i in range(min(closest, heads - closest))]
    return slopes


def mpt_slopes(heads: int, bias_max: float = 8.0) -> list[float]:
    """MPT's ``build_mpt_alibi_tensor``: 1 / 2^(bias_max * i / n) over the next power of two n,
    its odd then even entries when heads is not one."""
    n = 2 ** math.ceil(math.log2(heads))
    slopes = [1.0 / 2.0 ** ((i + 1) * bias_max / n) for i in range(n)]
    if n != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return slopes
