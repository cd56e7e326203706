"""The parity sweep: which (batch, seq, past, padding) cases to run, their named inputs, and
whether the largest of them fits in memory before anything is allocated.

Inputs are fresh random values per case (nothing was used at export: there is no example
input). attention_mask marks padding on the left (row r of a batch starts with pads, the usual
layout for batched generation) or on the right; row 0 is never padded.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import ml_dtypes
import numpy as np

from ..comparison.runner import positions
from ..config import MHAConfig
from ..env import available_bytes
from ..errors import UsageError
from ..signature import CACHE, FLOAT, INDEX_K, INT8, Signature

PADDINGS = ("none", "left", "right")
SWEEPS = ("full", "quick")  # check's default; the export-time check's default
BATCH_SIZES = (1, 3)  # the sweep's batch sizes unless told
QUICK_LONG_T = 64  # the quick sweep runs longer calls at batch 1 over an empty or short cache


@dataclass(frozen=True)
class Case:
    batch: int
    seq: int
    past: int = 0
    padding: str = "none"
    scenario: str = ""  # "" for one call; scenarios.py names its multi-call runs
    positions_end: int = 0  # rotary: max(position_ids) + 1 of the call (0: from the shape)
    inputs: str = "random"  # "real": x is a captured layer input (check --inputs), not N(0, 1)

    def label(self) -> str:
        s = "real inputs: " if self.inputs == "real" else ""
        s += f"{self.scenario}: " if self.scenario else ""
        s += f"B={self.batch} T={self.seq}"
        s += f" P={self.past}" if self.past else ""
        s += f" max(pos)+1={self.positions_end}" if self.positions_end else ""
        return s + (f" {self.padding}-pad" if self.padding != "none" else "")

    def to_dict(self) -> dict:
        return asdict(self)


def default_seq_lens(max_seq_len: int, switch_seq_lens: Sequence[int] = ()) -> list[int]:
    """T=1, lengths never used at export, T=max_seq_len and one past it (longer inputs are
    supported: the mask comes from the runtime length), and both sides of every length where the
    graph form switches code path."""
    m = max_seq_len
    base = {t for t in (1, 2, 7, 64, 100, 257, m - 1, m, m + 1) if 1 <= t <= m + 1}
    return sorted(base | set(switch_seq_lens))


def default_past_lens(max_seq_len: int) -> list[int]:
    """Cache lengths for decode models: empty (prefill), one, several, and up to the context."""
    return sorted({p for p in (0, 1, 5, max_seq_len - 1) if p >= 0})


def make_cases(sig: Signature, batch_sizes: Sequence[int], seq_lens: Sequence[int],
               past_lens: Sequence[int] = (0,), rope_switch: int = 0,
               static_chunks: bool = True, sweep: str = "full") -> list[Case]:
    """Every (batch, seq) [x past] (the quick sweep: those ``in_quick_sweep`` keeps); models
    with an attention_mask also run padded batches; a longrope layer also runs calls whose
    max(position_ids) + 1 is its switch length and one more (both tables), however long its
    context."""
    pasts = list(past_lens) if sig.follows_past else [0]
    cases = [Case(b, t, p) for b in batch_sizes for t in seq_lens for p in pasts
             if static_chunks or not sig.static_cache or b == 1 or t == 1 or p == 0]
    if sweep == "quick":
        cases = [c for c in cases if in_quick_sweep(c, pasts, seq_lens)]
    if rope_switch:
        cases += [Case(b, t, pasts[0], positions_end=end) for b in batch_sizes for t in (1, 7)
                  for end in (rope_switch, rope_switch + 1)]
    if sig.has_mask:  # padded batches at a few shapes: the longest T, and T=1 past a cache
        for b in sorted({max(batch_sizes), 3}):
            for pad in ("left", "right"):
                cases.append(Case(b, max(seq_lens), pasts[0], pad))
                if sig.follows_past:
                    cases.append(Case(b, 1, max(pasts), pad))
    return cases


def within_bounds(cases: Sequence[Case], bounds: Optional[dict]) -> list[Case]:
    """The cases a program with stated axis bounds accepts (an ExecuTorch program: batch <=
    bounds["batch"], seq <= bounds["seq"], past + seq <= bounds["cache"] where its cache lives
    inside it; its memory is planned for them; batch == bounds["rows"] where it runs a static
    batch); all without. The defaults' cases past them are left out; lengths asked for are
    refused first (``require_runnable``)."""
    if not bounds:
        return list(cases)
    return [c for c in cases if c.batch <= bounds["batch"] and c.seq <= bounds["seq"]
            and c.past + c.seq <= bounds.get("cache", c.past + c.seq)
            and c.batch == bounds.get("rows", c.batch)]


def require_runnable(sig: Signature, bounds: Optional[dict], seq_lens: Optional[Sequence[int]],
                     batch_sizes: Optional[Sequence[int]],
                     past_lens: Optional[Sequence[int]]) -> None:
    """The sweep's lengths asked for (None: the defaults) that a program's bounds cannot take
    (``within_bounds``), refused before any work: each asked-for value runs or is refused,
    never dropped. (Cache lengths apply to the cached calls: a full-sequence call has none;
    the CLI refuses --past-lens for one, ``require_past``.)"""
    if not bounds:
        return
    rows = bounds.get("rows")  # a static batch: exactly these rows
    over = ([f"--batch-sizes {b}" for b in batch_sizes or ()
             if b > bounds["batch"] or b != (rows or b)]
            + [f"--seq-lens {t}" for t in seq_lens or () if t > bounds["seq"]]
            + [f"--past-lens {p}" + (f" with --seq-lens {t}" if seq_lens else "")
               for p in past_lens or () for t in sorted(seq_lens or (1,))
               if "cache" in bounds and p + t > bounds["cache"]])
    if over:
        raise UsageError(f"{over[0]} is past the program's bounds ({bounds_text(bounds)}, "
                         "set at export by --max-batch and --max-seq-len)")


PAST_WITHOUT_CACHE = ("--past-lens: a full-sequence call has no past (cache lengths are the "
                      "--kv-cache and --static-cache calls')")


def require_past(past_lens: Optional[Sequence[int]], follows_past: bool) -> None:
    """--past-lens given on the command line for a call without a past: refused, not ignored
    (the Python API applies a sweep's cache lengths to the calls that have one)."""
    if past_lens and not follows_past:
        raise UsageError(PAST_WITHOUT_CACHE)


def bounds_text(bounds: dict) -> str:
    """'batch <= 4, seq <= 1024, past + seq <= 1024' ('batch = 1' for a static batch)."""
    batch = f"batch = {bounds['rows']}" if "rows" in bounds else f"batch <= {bounds['batch']}"
    return f"{batch}, seq <= {bounds['seq']}" + (
        f", past + seq <= {bounds['cache']}" if "cache" in bounds else "")


def in_quick_sweep(case: Case, pasts: Sequence[int], seq_lens: Sequence[int]) -> bool:
    """The export-time sweep keeps the cases that catch faults and drops the product of long
    calls with batch 3 and long caches, where the time goes (a case costs B * T * (P + T)):
    every call of up to QUICK_LONG_T tokens at every batch size and cache length (steps, odd
    lengths, the cache full, past the context length); every longer length (each code path,
    the context length and one past it) at batch 1 over an empty cache, and the longest over
    the shortest non-empty one."""
    if case.seq <= QUICK_LONG_T:
        return True
    shortest = sorted(pasts)[:2]
    return case.batch == 1 and (case.past == shortest[0] or (
        case.past == shortest[-1] and case.seq == max(seq_lens)))


def padding_mask(case: Case) -> np.ndarray:
    """(B, P+T) int64: row r has r * S // (2B) pads (row 0 none), on the case's side."""
    b, s = case.batch, case.past + case.seq
    mask = np.ones((b, s), np.int64)
    if case.padding == "none":
        return mask
    for r in range(1, b):
        n = min(s - 1, max(1, r * s // (2 * b)))
        if case.padding == "left":
            mask[r, :n] = 0
        else:
            mask[r, s - n:] = 0
    return mask


def shifts(case: Case) -> np.ndarray:
    """(B, T) added to the sweep's positions: row r starts 3*r later, and the second half of each
    row jumps 2 further. Rotary attention depends only on position differences, so a uniform
    shift would go unseen; the jump makes a model that ignores position_ids fail."""
    t = np.arange(case.seq, dtype=np.int64)
    return 3 * np.arange(case.batch, dtype=np.int64)[:, None] + 2 * (t >= case.seq // 2)


def make_feeds(sig: Signature, case: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, case.batch, case.seq, case.past,
                                 PADDINGS.index(case.padding)])
    sizes = {"batch": case.batch, "seq": case.seq, "past_seq": case.past,
             "past_seq + seq": case.past + case.seq, CACHE: static_capacity(case),
             INDEX_K: sample_width(case)}
    if sig.axis_sizes:  # a kind's own cache: its axes after case.past tokens
        sizes.update(sig.axis_sizes(case.past))
    feeds = {}
    for t in sig.inputs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in t.shape)
        if t.name == "attention_mask":
            feeds[t.name] = padding_mask(case)[:, -shape[1]:]
        elif t.name == "position_ids":
            pos = positions(padding_mask(case))[:, -case.seq:] + shifts(case)
            if case.positions_end:  # moved so that the call's max(pos) + 1 is positions_end
                pos = pos + (case.positions_end - 1 - int(pos.max()))
            feeds[t.name] = pos
        elif t.name == "past_lengths":
            feeds[t.name] = static_lengths(case)
        elif t.name == "topk_indices":
            feeds[t.name] = sample_selection(rng, case)
        elif t.dtype in (FLOAT, INT8):  # a static buffer: random beyond the valid entries too
            feeds[t.name] = random_values(rng, shape, t.dtype)
        else:
            raise ValueError(f"no sample values for input {t.name!r}")  # declare them here
    return feeds


NUMPY_HALF = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def in_model_dtype(feeds: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Float32 inputs rounded to a float16 / bfloat16 model's dtype (kept float32): such a file
    takes its inputs in that dtype, so every runner, eager included, reads the same values."""
    if dtype not in NUMPY_HALF:
        return feeds
    return {n: v.astype(NUMPY_HALF[dtype]).astype(np.float32) if v.dtype == np.float32 else v
            for n, v in feeds.items()}


def random_values(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Standard-normal floats, or (an int8 cache's codes) uniform over every int8 value."""
    if dtype == INT8:
        return rng.integers(-128, 128, shape, dtype=np.int8)
    return rng.standard_normal(shape).astype(np.float32)


def sample_width(case: Case) -> int:
    """A sample selection's keys a query (INDEX_K): 3 of the S keys a call reads (fewer while
    S is less; within an ExecuTorch program's bound, min(index_topk, max_seq_len))."""
    return min(3, case.past + case.seq)


def sample_selection(rng: np.random.Generator, case: Case) -> np.ndarray:
    """(B, T, K) int64: a shared-top-k layer's given selection of the S keys a call reads:
    each query's own position first (a real query keeps a visible key), then random positions
    up to it, the last one past the keys (keeping nothing) where K > 2."""
    s = case.past + case.seq
    own = case.past + np.arange(case.seq)  # (T,) the queries' positions
    k = sample_width(case)
    picks = rng.integers(0, own[None, :, None] + 1, (case.batch, case.seq, k))  # (B, T, K)
    picks[..., 0] = own
    picks[..., -1] = np.where(k > 2, s, picks[..., -1])
    return picks.astype(np.int64)


def static_lengths(case: Case) -> np.ndarray:
    """(B,) int64 valid entries of each row of a static cache: row r has past - 2r (a ragged
    batch), at least 0."""
    return np.maximum(case.past - 2 * np.arange(case.batch), 0).astype(np.int64)


def static_capacity(case: Case) -> int:
    """A static buffer with room to spare: entries beyond the write are never read."""
    return case.past + case.seq + 3


def real_queries(feeds: dict[str, np.ndarray], case: Case) -> Optional[np.ndarray]:
    """(B, T, 1) bool: the query rows that are real tokens, or None when nothing is padded."""
    mask = feeds.get("attention_mask")
    return None if mask is None else (mask[:, -case.seq:] == 1)[:, :, None]


def valid_entries(sig: Signature, feeds: dict[str, np.ndarray], case: Case
                  ) -> dict[str, Optional[np.ndarray]]:
    """Per output, the elements that are compared (None: all; the rest only required finite):
    y's rows of real tokens (padding rows are not), a static buffer's valid entries
    [0, past_lengths[b] + T) (beyond them the contract says nothing)."""
    valid: dict[str, Optional[np.ndarray]] = {"y": real_queries(feeds, case)}
    valid["topk_indices"] = valid["y"]  # a DSA layer's selection: the real queries' rows
    if sig.static_cache:
        starts = feeds["past_lengths"][:, None]  # (B, 1)
        slots = np.arange(static_capacity(case))[None, :]  # (1, C)
        entries = slots < starts + case.seq  # (B, C)
        written = (slots >= starts) & entries  # (B, C): this call's own entries
        for name in ("present_key", "present_value"):
            valid[name] = entries[:, None, :, None]
            valid[written_key(name)] = written[:, None, :, None]
    return valid


def written_key(output: str) -> str:
    """The ``valid_entries`` key of the entries of ``output`` the call itself wrote."""
    return f"{output}:written"


ScoresAt = Callable[[int], bool]  # T -> whether the model materialises (N, T, S) scores


def case_bytes(config: MHAConfig, case: Case, scores_at: ScoresAt, masked: bool) -> int:
    """A generous estimate of the peak bytes one case needs across the runners: activations in
    float64 for the reference, (N, T, S) scores where the model materialises them, and the
    eager module's (B, 1, T, S) mask where the call has a cache or padding mask."""
    b, t, s, c = case.batch, case.seq, case.past + case.seq, config
    width = c.d_in + c.dim + c.inner + 2 * c.kv_inner
    linear = 8 * b * (t * width * 3 + 4 * s * c.attended_kv_width)
    scores = 8 * 2 * b * c.heads * t * s if scores_at(t) else 0
    mask = 8 * 2 * b * t * s if masked else 0
    return linear + scores + mask


WINDOW_CASE_BYTES = 2**31  # a window-crossing full call is added when it needs less than this


def window_cases(config: MHAConfig, sig: Signature, seq_lens: Sequence[int],
                 scores_at: ScoresAt) -> list[Case]:
    """Calls that cross a sliding window (or a chunk, or a sparse layer's top-k) longer than
    the sweep's lengths (a checkpoint's 4096 window over a 1024 context, Llama 4's 8192-token
    chunks, DeepSeek-V3.2's top 2048 keys): a cached step past it, or one full call of
    window + 1 tokens where it needs less than 2 GiB."""
    w = config.reach
    if not w or w + 1 <= max(seq_lens):
        return []
    if sig.follows_past:
        return [Case(1, 2, w)]
    case = Case(1, w + 1)
    return [case] if case_bytes(config, case, scores_at, sig.has_mask) < WINDOW_CASE_BYTES else []


def require_fits(config: MHAConfig, cases: Sequence[Case], scores_at: ScoresAt,
                 masked: bool) -> None:
    """A sweep whose largest case cannot fit is bad input, refused before anything is allocated
    (as is one with no case: nothing would be checked)."""
    if not cases:
        raise UsageError("the sweep has no case this artifact's call can take: choose other "
                         "--batch-sizes / --seq-lens / --past-lens")
    worst = max(cases, key=lambda k: case_bytes(config, k, scores_at, masked))
    need, have = case_bytes(config, worst, scores_at, masked), available_bytes()
    if need > have:
        raise UsageError(f"the sweep's largest case ({worst.label()}) needs about "
                         f"{need / 2**30:,.1f} GiB; {have / 2**30:,.1f} GiB is available: "
                         "use smaller --batch-sizes / --seq-lens (check), or a smaller "
                         "--max-seq-len or --no-check (export)")
