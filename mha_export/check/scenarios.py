"""Multi-call proofs for KV-cache models, run through every runner (the eager cache path too):

1. ``generate``: a prefill and then single-token (and one chunked) steps, carrying present ->
   past and growing attention_mask, equal ONE full-sequence forward of the whole sequence at
   every real position; the final present_key/present_value equal the full forward's keys/values.
2. ``padded-vs-alone``: a left- or right-padded batch, generated the same way, equals each of its
   sequences run alone without padding.

Expected values come from the eager module (float32 and the float64 reference), never from the
model under test.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ..config import MHAConfig
from .runners.base import Feeds, Runner
from .sweep import Case, padding_mask, positions

Expect = Callable[[np.ndarray, np.ndarray], dict]  # (x, mask) -> {"y", "present_key", ...}


def eager_full(module) -> Expect:
    """One full-sequence call of the eager module (padding mask, no cache), in its dtype."""
    dtype = next(module.parameters()).dtype

    def run(x: np.ndarray, mask: np.ndarray) -> dict:
        with torch.inference_mode():
            y, k, v = module.attend(torch.from_numpy(x).to(dtype), torch.from_numpy(mask),
                                    None, None, torch.from_numpy(positions(mask)))
        return {"y": y.numpy(), "present_key": k.numpy(), "present_value": v.numpy()}
    return run


def generate(runner: Runner, config: MHAConfig, x: np.ndarray, mask: np.ndarray,
             split: Sequence[int]) -> Feeds:
    """Calls of len split[0], split[1], ... with the cache carried: y of all calls (B, L, dim)
    and the last present_key/present_value (B, K, L, H)."""
    b = x.shape[0]
    empty = np.zeros((b, config.kv_heads, 0, config.head_dim), np.float32)
    past = {"past_key": empty, "past_value": empty}
    ys, pos = [], 0
    rope = {"position_ids": positions(mask)} if "position_ids" in runner.signature.input_names \
        else {}
    for n in split:
        out = runner.run({"x": x[:, pos:pos + n], "attention_mask": mask[:, :pos + n], **past,
                          **{k: v[:, pos:pos + n] for k, v in rope.items()}})
        ys.append(out["y"])
        past = {"past_key": out["present_key"], "past_value": out["present_value"]}
        pos += n
    return {"y": np.concatenate(ys, axis=1), "present_key": past["past_key"],
            "present_value": past["past_value"]}


def alone(expect: Expect, x: np.ndarray, mask: np.ndarray) -> dict:
    """y of each row run alone (its real tokens only, no padding), placed at the row's real
    positions of a (B, L, dim) array; padding positions are 0 (and not compared)."""
    out = None
    for r in range(x.shape[0]):
        real = mask[r] == 1
        y = expect(x[r:r + 1, real], np.ones((1, int(real.sum())), np.int64))["y"]
        out = np.zeros(x.shape[:2] + y.shape[2:], y.dtype) if out is None else out
        out[r, real] = y[0]
    return {"y": out}


def scenario_cases(switch_seq_lens: Sequence[int] = ()) -> list[tuple[Case, list[int]]]:
    """(case, call lengths): prefill, three steps, a chunk of 3, a step; one long prefill past the
    form's last code-path switch; padded batches of both sides."""
    splits = [[5, 1, 1, 1, 3, 1]]
    if switch_seq_lens:
        splits.append([max(switch_seq_lens) + 2, 1, 2])
    cases = [(Case(b, sum(s), 0, pad, "generate " + "+".join(map(str, s))), s)
             for s in splits for b, pad in ((1, "none"), (3, "left"))]
    cases += [(Case(3, 9, 0, pad, "padded-vs-alone 7+1+1"), [7, 1, 1])
              for pad in ("left", "right")]
    return cases


def scenario_inputs(config: MHAConfig, case: Case, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 7, case.batch, case.seq])
    x = rng.standard_normal((case.batch, case.seq, config.d_in)).astype(np.float32)
    return x, padding_mask(Case(case.batch, case.seq, 0, case.padding))


def expected(case: Case, expect: Expect, x: np.ndarray, mask: np.ndarray) -> dict:
    if case.scenario.startswith("padded-vs-alone"):
        return alone(expect, x, mask)
    return expect(x, mask)
