"""Multi-call proofs for KV-cache models, run through every runner (the eager cache path too):

1. ``generate``: a prefill and then single-token (and one chunked) steps, carrying present ->
   past and growing attention_mask, equal ONE full-sequence forward of the whole sequence at
   every real position; the final present_key/present_value equal the full forward's keys/values
   (a kind's own cache, DeepSeek-V4's: its every present_* equals what ONE cached call of the
   whole sequence from an empty cache leaves: the last window - 1 rows, the compressor state).
2. ``padded-vs-alone``: a left- or right-padded batch, generated the same way, equals each of its
   sequences run alone without padding (right-padded only where queries scale by cache slot,
   Llama 4's temperature tuning: a left-padded row's slots are not its own, as in transformers).

Static-cache models (an app-owned buffer written in place, ``past_lengths``):

3. ``static generate``: prefill, steps (and a chunk where the form runs chunks at batch > 1) into
   one buffer equal one full forward; the buffer's valid entries equal its keys/values.
4. ``static ragged``: rows of different lengths — a right-padded prefill, then each row's
   past_lengths set to its real length, then single-token steps — equal each row run alone, and
   each row's valid entries equal that row's keys/values (the padding's entries are overwritten).

Expected values come from the eager module (float32 and the float64 reference), never from the
model under test.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ..config import MHAConfig
from ..comparison.runner import Feeds, Runner
from ..comparison.torch_runners import EagerRunner
from ..signature import Signature
from .sweep import Case, padding_mask, positions, random_values

Expect = Callable[[np.ndarray, np.ndarray], dict]  # (x, mask) -> {"y", "present_key", ...}


SPARE = 3  # a static scenario's buffer: entries beyond its calls' (never read)

def eager_full(module) -> Expect:
    """One full-sequence call of the eager module (padding mask, no cache), in its dtype."""
    dtype = next(module.parameters()).dtype

    def run(x: np.ndarray, mask: np.ndarray) -> dict:
        with torch.inference_mode():
            y, k, v = module.attend(torch.from_numpy(x).to(dtype), torch.from_numpy(mask),
                                    None, None, torch.from_numpy(positions(mask)))
        return {"y": y.numpy(), "present_key": k.numpy(), "present_value": v.numpy()}
    return run


def generate(runner: Runner, x: np.ndarray, mask: np.ndarray, split: Sequence[int]) -> Feeds:
    """Calls of len split[0], split[1], ... with every cache tensor carried (present_<t> ->
    past_<t>): y of all calls (B, L, dim) and the last present_* (present_key/present_value
    (B, K, L, H); a kind's own cache, its own)."""
    sig = runner.signature
    past, ys, pos = empty_cache(sig, x.shape[0]), [], 0
    rope = {"position_ids": positions(mask)} if "position_ids" in sig.input_names else {}
    for n in split:
        out = runner.run({"x": x[:, pos:pos + n], "attention_mask": mask[:, :pos + n], **past,
                          **{k: v[:, pos:pos + n] for k, v in rope.items()}})
        ys.append(out["y"])
        past = {p: out[q] for p, q in sig.cache_pairs}
        pos += n
    return {"y": np.concatenate(ys, axis=1), **{q: past[p] for p, q in sig.cache_pairs}}


def empty_cache(sig: Signature, batch: int) -> Feeds:
    """A prefill's past_* inputs: every symbolic axis but the batch 0 long."""
    return {n: np.zeros(shape, np.float32) for n, shape in sig.prefill_shapes(batch).items()}


def one_call(runner: Runner) -> Expect:
    """The whole sequence in one cached call from an empty cache: a kind's own cache (its
    present_key the last rows, its state) is compared with what this call leaves."""
    sig = runner.signature

    def run(x: np.ndarray, mask: np.ndarray) -> dict:
        rope = {"position_ids": positions(mask)} if "position_ids" in sig.input_names else {}
        return runner.run({"x": x, "attention_mask": mask, **empty_cache(sig, x.shape[0]),
                           **rope})
    return run


def expect_of(runner: EagerRunner) -> Expect:
    """A scenario's truth from an eager runner: one full-sequence forward, or for a kind's own
    cache (``Signature.own_cache``: not the call's keys and values) one cached call."""
    return one_call(runner) if runner.signature.own_cache else eager_full(runner.source)


def alone(expect: Expect, x: np.ndarray, mask: np.ndarray,
          caches: Sequence[str] = ("present_key", "present_value")) -> dict:
    """y of each row run alone (its real tokens only, no padding), placed at the row's real
    positions of a (B, L, dim) array, and each row's keys/values (``caches``) packed at
    [0, real length) of (B, K, L, H); the rest is 0 (and not compared)."""
    out: dict = {}
    for r in range(x.shape[0]):
        real = mask[r] == 1
        got = expect(x[r:r + 1, real], np.ones((1, int(real.sum())), np.int64))
        if not out:
            out = {"y": np.zeros(x.shape[:2] + got["y"].shape[2:], got["y"].dtype)}
            out.update({n: np.zeros((x.shape[0], got[n].shape[1], x.shape[1], got[n].shape[3]),
                                    got[n].dtype) for n in caches})
        out["y"][r, real] = got["y"][0]
        for n in caches:
            out[n][r, :, :int(real.sum())] = got[n][0]
    return out


def generate_static(runner: Runner, x: np.ndarray, mask: np.ndarray,
                    split: Sequence[int]) -> Feeds:
    """Calls of len split[0], split[1], ... into one buffer of capacity L + 3 (random beyond the
    writes: never read), past_lengths advanced by each call — after a right-padded prefill
    (mask 0 inside it) to each row's real length. y of all calls (B, L, dim), the buffer's
    first L entries (B, K, L, H)."""
    b, length = x.shape[:2]
    rng = np.random.default_rng(11)
    dtype = runner.signature.cache_dtype  # an int8 cache: random codes
    cache = {n: random_values(rng, runner.signature.cache_buffer(n, b, length + SPARE), dtype)
             for n in ("past_key", "past_value")}
    lengths, ys, start = np.zeros(b, np.int64), [], 0
    for n in split:
        steps = lengths[:, None] + np.arange(n)  # (B, n) rotary positions
        rope = {"position_ids": steps} if "position_ids" in runner.signature.input_names else {}
        out = runner.run({"x": x[:, start:start + n], **cache, "past_lengths": lengths, **rope})
        ys.append(out["y"])
        cache = {"past_key": out["present_key"], "past_value": out["present_value"]}
        lengths = lengths + mask[:, start:start + n].sum(axis=1)  # a padded prefill: real only
        start += n
    return {"y": np.concatenate(ys, axis=1), "present_key": cache["past_key"][:, :, :length],
            "present_value": cache["past_value"][:, :, :length]}


def static_valid(case: Case, mask: np.ndarray) -> dict:
    """What a static scenario compares: y at real tokens, each row's valid buffer entries."""
    entries = np.arange(mask.shape[1])[None, :] < mask.sum(axis=1)[:, None]  # (B, L)
    return {"y": (mask == 1)[:, :, None], "present_key": entries[:, None, :, None],
            "present_value": entries[:, None, :, None]}


def static_scenario_cases(static_chunks: bool = True, batch_prompts: bool = True
                          ) -> list[tuple[Case, list[int]]]:
    """One buffer: prefill + steps (+ a chunk of 3 at batch 1, and at batch 3 where the form
    runs chunks), and a ragged batch (right-padded prefill of rows of 7, 5 and 3 tokens);
    the batch-3 ones only where the form runs prompts at batch > 1."""
    splits = [(1, [5, 1, 1, 1, 3, 1]), (3, [5, 1, 1, 1, 3, 1] if static_chunks else [5, 1, 1])]
    cases = [(Case(b, sum(s), 0, "none", "static generate " + "+".join(map(str, s))), s)
             for b, s in splits]
    cases += [(Case(3, 9, 0, "right", "static ragged 7|5|3+1+1"), [7, 1, 1])]
    return cases if batch_prompts else [(case, split) for case, split in cases if case.batch == 1]


def padding_sides(config: MHAConfig) -> tuple[str, ...]:
    """The sides a padded batch equals its rows alone: not the left where queries scale by
    cache slot, or where keys sit at their slots (``generate_padding``): a left-padded row's
    slots are shifted by its padding, by design."""
    if (config.query_scale_beta and config.query_scale_by == "slot") or keys_by_slot(config):
        return ("right",)
    return ("left", "right")


def keys_by_slot(config: MHAConfig) -> bool:
    """The section's ``slot_positions``: a key's position is its slot after the call's first
    query's position (DeepSeek-V4's window and pooled windows), so a call's left padding at
    positions from the mask (``positions``) moves its keys from where later calls see them."""
    return getattr(config.section, "slot_positions", False)


def generate_padding(config: MHAConfig) -> str:
    """The side of a padded batch generated: the left, as apps pad (the right where keys sit
    at their slots)."""
    return "right" if keys_by_slot(config) else "left"


def scenario_cases(switch_seq_lens: Sequence[int] = (), padded: Sequence[str] = ("left", "right"),
                   generated: str = "left") -> list[tuple[Case, list[int]]]:
    """(case, call lengths): prefill, three steps, a chunk of 3, a step (also a batch padded on
    the ``generated`` side); one long prefill past the form's last code-path switch; padded
    batches of the ``padded`` sides."""
    splits = [[5, 1, 1, 1, 3, 1]]
    if switch_seq_lens:
        splits.append([max(switch_seq_lens) + 2, 1, 2])
    cases = [(Case(b, sum(s), 0, pad, "generate " + "+".join(map(str, s))), s)
             for s in splits for b, pad in ((1, "none"), (3, generated))]
    cases += [(Case(3, 9, 0, pad, "padded-vs-alone 7+1+1"), [7, 1, 1])
              for pad in padded]
    return cases


def scenario_inputs(config: MHAConfig, case: Case, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 7, case.batch, case.seq])
    x = rng.standard_normal((case.batch, case.seq, config.d_in)).astype(np.float32)
    if case.scenario.startswith("static ragged"):  # rows of 7, 5, 3 real prompt tokens, 2 steps
        mask = np.ones((case.batch, case.seq), np.int64)
        for r in range(case.batch):
            mask[r, 7 - 2 * r:7] = 0
        return x, mask
    return x, padding_mask(Case(case.batch, case.seq, 0, case.padding))


def expected(case: Case, expect: Expect, x: np.ndarray, mask: np.ndarray) -> dict:
    if case.scenario.startswith("static ragged"):  # each row's buffer entries, packed
        return alone(expect, x, mask)
    if case.scenario.startswith("padded-vs-alone"):  # a growing cache keeps the padding's slots
        return {"y": alone(expect, x, mask, ())["y"]}
    return expect(x, mask)


def run(runner: Runner, case: Case, x: np.ndarray, mask: np.ndarray,
        split: Sequence[int]) -> Feeds:
    """The case's calls through the runner, cache buffers shaped by its signature."""
    if case.scenario.startswith("static"):
        return generate_static(runner, x, mask, split)
    return generate(runner, x, mask, split)


def valid(case: Case, mask: np.ndarray) -> dict:
    if case.scenario.startswith("static"):
        return static_valid(case, mask)
    return {"y": (mask == 1)[:, :, None]}
