"""``mha-export eval``: the exported attention layers inside the real model, judged in the
model's own terms — perplexity, next-token agreement, divergence — and each lossy step's share.

    checkpoint (transformers) -> each chosen layer exported (export options, one artifact per
    layer) -> the text run twice: eager, and with those layers' attention computed by their
    artifacts in a runner (the rest of the model eager) -> metrics -> report

Prefill: the text's first N tokens in one call per layer (a full-sequence artifact; a decode
artifact with an empty cache when the options ask for a cache or --generate does). Generation
(``generate`` K): greedy tokens, each step running the decode artifacts over their caches (owned
here: a growing cache carried from call to call, or one static buffer written at
past_lengths), against eager's greedy continuation of the same prefix. The eager layers recompute
the prefix each step (no transformers cache to keep consistent with the artifacts' own).

Metrics (positions 0..N-1 of the prefill): perplexity = exp(mean cross-entropy of tokens 2..N
given their prefixes); KL(eager || exported) of each next-token distribution; top-1 agreement =
the share of positions whose argmax agrees. Per layer: how far each artifact's output was from
the eager attention on the very hidden states it received (max|d| / max|y|, cosine), so a defect
shows up as its layer.

Attribution (``attribute``): the lossy steps of the options run alone and together — fp32 export;
weights (quantized, at fp32 compute); + the kernel's int8 activations (accuracy level 4); the
int8 cache — and, with ``per_layer``, the options with one layer exported at a time.
"""
from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from ..address import Address
from ..check.runners.ort_threads import DEFAULT as DEFAULT_THREAD_POOL, get_policy
from ..errors import UsageError
from ..env import openmp_wait
from ..lossy import registry as lossy
from ..targets.registry import eval_options, target_of_file
from ..weights.source import (checkpoint_layers, checkpoint_modules, non_attention_layers,
                              select_layers)
from .capture import checked_before_loading, read_text, token_block
from .loading import LoadedModel, attention_at, decoder_layers, load_model, set_attention

Progress = Callable[[int, int, str], None]
EXPORT_KEYS = ("opset", "kv_cache", "static_cache") + tuple(
    o.name for _, o in eval_options()) + lossy.api_keys()


def _preflight(weights: str | Path, runner: str, options: dict, layer: Address) -> None:
    """The layers' export request checked before the model loads (tens of seconds): what the
    runner's target refuses of these options is one line now, not after the loading."""
    from ..check.runners import RUNNERS
    from ..export.pipeline import checked_export
    checked_export(target_of_file(RUNNERS[runner].model_file).name, weights=weights,
                   layer=layer, **options)


def _require_target_of(options: dict, runner: str) -> None:
    """An export target's own option (its record's, ``in_eval``) needs a runner of that
    target's file."""
    from ..check.runners import RUNNERS
    for target, option in eval_options():
        if options.get(option.name) and RUNNERS[runner].model_file != target.model_file:
            raise UsageError(f"{option.flag} is an option of the {target.name} target: add "
                             f"--runner {target.runners[0].name if target.runners else 'ort-cpu'}")


# --- metrics --------------------------------------------------------------------------------

def perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """exp(mean cross-entropy of tokens 2..N given their prefixes); logits (N, V), ids (N,)."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)  # (N-1, V)
    return float(torch.exp(-logp.gather(1, ids[1:, None]).mean()))


def kl_per_position(eager: torch.Tensor, exported: torch.Tensor) -> np.ndarray:
    """KL(eager || exported) of each position's next-token distribution, (N,) float64."""
    p = torch.log_softmax(eager.double(), dim=-1)
    q = torch.log_softmax(exported.double(), dim=-1)
    return (p.exp() * (p - q)).sum(-1).numpy()


@dataclass
class LayerDetail:
    """One exported layer inside the model: its artifact, what ran it, and how far its output
    was from the eager attention on the hidden states it received (prefill)."""

    layer: Address
    artifact: str
    runner: str
    rel: float = float("nan")  # max|d| / max|y|
    cosine: float = float("nan")
    reused: bool = False  # an artifact --exports already held (made with the same options)


@dataclass
class RunResult:
    """One exported configuration of the layers, against eager."""

    name: str
    options: dict
    layers: list[Address]
    perplexity: float
    top1_agreement: float
    kl_mean: float
    kl_max: float
    kl: list[float]  # per prefill position
    tokens_per_s: float  # the exported prefill's (median of the timed runs)
    generated: list[int] = field(default_factory=list)
    details: list[LayerDetail] = field(default_factory=list)
    speed: Optional["Speed"] = None  # prefill and generation, eager and exported, side by side

    def summary(self) -> dict:
        return {"perplexity": self.perplexity, "top1_agreement": self.top1_agreement,
                "kl_mean": self.kl_mean, "kl_max": self.kl_max}


# --- the stand-in for one layer's attention --------------------------------------------------

class ExportedAttention(torch.nn.Module):
    """Stands in for a decoder layer's attention module: its artifact in a runner. It keeps the
    sequence's cache (decode artifacts) and the outputs it gave, so that a call over a longer
    prefix runs only the new tokens."""

    def __init__(self, original: torch.nn.Module, runner: Any, capacity: int):
        super().__init__()
        self.original, self.runner, self.capacity = original, runner, capacity
        self.sig = runner.signature
        # GLM-5's attention modules take the previous layer's top-k and return the one they
        # used (a shared layer's: the one given, its artifact reads it as topk_indices; a DSA
        # layer whose selection later shared layers read: its artifact's output topk_indices)
        self.passes_topk = "prev_topk_indices" in inspect.signature(original.forward).parameters
        self.gives_topk = "topk_indices" in self.sig.output_names
        self.deviations: list[tuple[float, float]] = []  # (rel, cosine) per prefill call
        self.comparing = True  # off for the timed run
        # True: each call brings only new tokens (the model runs with its own cache, as in
        # cached generation); False: each call brings the whole prefix
        self.incremental = False
        self.bound: Optional[Callable[[dict], np.ndarray]] = None  # runner.bind_cache's call
        self.reset()

    def reset(self) -> None:
        self.length = 0
        self.outputs: Optional[torch.Tensor] = None  # (1, length, dim)
        self.selection: Optional[torch.Tensor] = None  # (1, length, K): gives_topk's rows
        if self.bound is not None:
            for buffer in self.cache.values():  # the bound buffers, emptied in place
                buffer.fill(0)
        elif self.sig.has_cache:
            size = self.capacity if self.sig.static_cache else 0
            dtype = np.int8 if self.sig.cache_dtype == "int8" else getattr(
                self.runner, "dtypes", {}).get("past_key", np.float32)  # the model's own
            shapes = ({n: self.sig.cache_buffer(n, 1, size) for n in ("past_key", "past_value")}
                      if self.sig.static_cache else self.sig.prefill_shapes(1))
            self.cache = {n: np.zeros(shape, dtype) for n, shape in shapes.items()}
            # a static cache: bound once where the runner can (an app's step, no copies; its
            # call gives y alone, so not where the selection is an output too)
            self.bound = self.runner.bind_cache(self.cache) if (
                self.sig.static_cache and not self.gives_topk) else None

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        topk = kwargs.get("prev_topk_indices")  # (1, T, K) of a GLM-5 model, or None
        if self.incremental:
            y, own = self._step(hidden_states, kwargs.get(
                "past_key_values", kwargs.get("past_key_value")), topk)
            return (y, None, *self._passed(topk, own))
        total = hidden_states.shape[1]
        if not self.sig.has_cache:  # a full-sequence artifact: every call from position 0
            self.reset()
        new = hidden_states[:, self.length:]  # (1, T, d_in): the tokens not yet attended
        rows = None if topk is None else topk[:, self.length:]  # (1, T, K): the new queries'
        y, own = self._run(new.detach().float().numpy(), rows)
        y = torch.from_numpy(y).to(hidden_states.dtype)
        if self.length == 0 and self.comparing:
            self._compare(hidden_states, y, *args, **kwargs)
        self.outputs = y if self.outputs is None else torch.cat([self.outputs, y], dim=1)
        if own is not None:
            self.selection = own if self.selection is None else _joined(self.selection, own)
        self.length = total
        return (self.outputs, None, *self._passed(topk, self.selection))

    def _passed(self, given: Optional[torch.Tensor], own: Optional[torch.Tensor]) -> tuple:
        """What the module returns after y and the weights: a GLM-5 layer's top-k (its
        artifact's own where it outputs one, else the one it was given); nothing elsewhere."""
        if not self.passes_topk:
            return ()
        return (own if self.gives_topk else given,)

    def _step(self, hidden_states: torch.Tensor, model_cache: Any,
              topk: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """New tokens only, over the artifact's own cache: y, and its selection (None: not an
        output). The model's cache gets a placeholder of the same length for this layer
        (1 x 1 x T x 1), so that the layers still eager and the mask see the right sequence
        length."""
        y, own = self._run(hidden_states.detach().float().numpy(), topk)
        self.length += hidden_states.shape[1]
        layer = getattr(self.original, "layer_idx", None)
        if model_cache is not None and layer is not None:
            place = hidden_states.new_zeros(1, 1, hidden_states.shape[1], 1)
            model_cache.update(place, place, layer)
        return torch.from_numpy(y).to(hidden_states.dtype), own

    def _run(self, x: np.ndarray, topk: Optional[torch.Tensor] = None
             ) -> tuple[np.ndarray, Optional[torch.Tensor]]:
        """y, and the artifact's selection (1, T, K) where it outputs one. ``topk`` (1, T, K):
        a shared-top-k layer's selection, its source layer's."""
        t = x.shape[1]
        feeds = {"x": x}
        if self.sig.reads_topk:
            feeds["topk_indices"] = topk.long().numpy()
        if "position_ids" in self.sig.input_names:
            feeds["position_ids"] = np.arange(self.length, self.length + t)[None]
        if "attention_mask" in self.sig.input_names:
            feeds["attention_mask"] = np.ones((1, self.length + t), np.int64)
        if "past_lengths" in self.sig.input_names:
            feeds["past_lengths"] = np.array([self.length], np.int64)
        if self.bound is not None:  # the fast path: the cache written in place
            return self.bound(feeds), None
        if self.sig.has_cache:
            feeds.update(self.cache)
        out = self.runner.run(feeds)
        if self.sig.has_cache:  # growing: the longer cache; static: the buffer, written
            self.cache = {p: out[q] for p, q in self.sig.cache_pairs}
        own = torch.from_numpy(out["topk_indices"]) if self.gives_topk else None
        return out["y"], own

    def _compare(self, hidden_states: torch.Tensor, y: torch.Tensor, *args, **kwargs) -> None:
        with torch.inference_mode():
            want = self.original(hidden_states, *args, **kwargs)[0].double()
        d = (y.double() - want).abs().max()
        scale = want.abs().max().clamp_min(1e-30)
        cos = torch.nn.functional.cosine_similarity(y.double().flatten(), want.flatten(), dim=0)
        self.deviations.append((float(d / scale), float(cos)))


def _joined(earlier: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Selections of successive calls (1, T1, K1), (1, T2, K2) as one (1, T1 + T2, K2): a call
    over more keys keeps up to more (K1 <= K2 = min(index_topk, keys)); an earlier row, which
    saw fewer than K2 keys, repeats its first pick (a repeated position keeps nothing more)."""
    wide = earlier[..., :1].expand(-1, -1, new.size(-1) - earlier.size(-1))  # (1, T1, K2-K1)
    return torch.cat([torch.cat([earlier, wide], dim=-1), new], dim=1)  # (1, T1 + T2, K2)


def _reset(stand_ins: dict[Address, "ExportedAttention"]) -> None:
    for s in stand_ins.values():
        s.reset()


def _incremental(stand_ins: dict[Address, "ExportedAttention"], call: Callable[[], Any]
                 ) -> Callable[[], Any]:
    """``call`` with the stand-ins taking new tokens only (the model runs its own cache)."""
    def run() -> Any:
        for s in stand_ins.values():
            s.incremental = True
        try:
            return call()
        finally:
            for s in stand_ins.values():
                s.incremental = False
    return run


@contextlib.contextmanager
def exported_layers(model: Any, stand_ins: dict[Address, ExportedAttention]) -> Iterator[None]:
    """The model with the chosen layers' attention replaced by their stand-ins, restored after
    (keyed by layer address: N, or N.M for one of a layer's attention modules)."""
    for address, stand_in in stand_ins.items():
        set_attention(model, address, stand_in)
    try:
        yield
    finally:
        for address, stand_in in stand_ins.items():
            set_attention(model, address, stand_in.original)


# --- running the text -----------------------------------------------------------------------

def logits_of(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """(N, V) float32 logits of one sequence ids (N,), no cache."""
    with torch.inference_mode():
        return model(input_ids=ids[None], use_cache=False).logits[0].float()


@dataclass
class Speed:
    """Tokens per second, eager and exported timed in turn in one loop (medians of REPEATS
    runs each): the prefill (the text in one call) and greedy generation as an app runs it
    (one token a call over the model's cache; eager: transformers' own cache, exported: each
    artifact's cache)."""

    eager_prefill: float
    exported_prefill: float
    eager_generation: float = float("nan")
    exported_generation: float = float("nan")
    thread_pool: str = ""
    repeats: int = 0
    torch_openmp: str = ""  # env.openmp_wait(): how long torch's threads spin after an op
    # the greedy tokens of the timed decodes (a cached path must give the uncached one's)
    eager_decoded: list[int] = field(default_factory=list)
    exported_decoded: list[int] = field(default_factory=list)

    def ratios(self) -> dict:
        return {"prefill": self.exported_prefill / self.eager_prefill,
                "generation": self.exported_generation / self.eager_generation}


REPEATS = 5


def cached_greedy(model: Any, ids: torch.Tensor, steps: int) -> tuple[list[int], float]:
    """``steps`` greedy tokens after ids as an app generates them: the prefix once, then one
    token a call over the model's cache (the stand-ins' own caches for their layers); the
    tokens and the seconds the decode steps took (the prefill not counted)."""
    with torch.inference_mode():
        out = model(input_ids=ids[None], use_cache=True)
        cache, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
        tokens, start = [nxt], time.perf_counter()
        for pos in range(len(ids), len(ids) + steps - 1):
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]]), cache_position=torch.tensor([pos]))
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
        return tokens, time.perf_counter() - start


def greedy(model: Any, ids: torch.Tensor, steps: int, reset: Callable[[], None]) -> list[int]:
    """``steps`` greedy tokens after ids; every step runs the whole prefix (the stand-ins run
    only its new token over their caches)."""
    reset()
    seq, out = ids.clone(), []
    for _ in range(steps):
        nxt = int(logits_of(model, seq)[-1].argmax())
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt])])
    return out


@dataclass
class Evaluation:
    """What ``evaluate`` measured; ``to_dict`` is the --json report (its names are stable)."""

    weights: str
    text: str
    tokens: int
    runner: str
    eager_perplexity: float
    eager_tokens_per_s: float
    main: RunResult
    eager_generated: list[int] = field(default_factory=list)
    attribution: list[RunResult] = field(default_factory=list)
    per_layer: list[RunResult] = field(default_factory=list)
    transformers_perplexity: float = float("nan")  # transformers' own loss on the same tokens
    budgets: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # layer -> its non-attention type
    left_to_model: dict[Address, str] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    def generation(self) -> dict:
        k = len(self.eager_generated)
        matched = next((i for i, (a, b) in enumerate(zip(self.eager_generated,
                                                          self.main.generated)) if a != b), k)
        return {"tokens": k, "matched": matched, "eager": self.eager_generated,
                "exported": self.main.generated}

    def to_dict(self) -> dict:
        def run(r: RunResult) -> dict:
            d = asdict(r)
            d["options"] = lossy.as_json(r.options)
            d["ppl_increase"] = r.perplexity / self.eager_perplexity - 1
            return d
        return {"weights": self.weights, "text": self.text, "tokens": self.tokens,
                "runner": self.runner,
                "eager": {"perplexity": self.eager_perplexity,
                          "transformers_perplexity": self.transformers_perplexity,
                          "tokens_per_s": self.eager_tokens_per_s},
                "exported": {**self.main.summary(),
                             "ppl_increase": self.main.perplexity / self.eager_perplexity - 1,
                             "tokens_per_s": self.main.tokens_per_s, "kl": self.main.kl},
                "speed": asdict(self.main.speed) if self.main.speed else None,
                "generation": self.generation(),
                "layers": [asdict(d) for d in self.main.details],
                "options": lossy.as_json(self.main.options),
                "attribution": [run(r) for r in self.attribution],
                "per_layer": [run(r) for r in self.per_layer],
                "left_to_model": {str(k): v for k, v in self.left_to_model.items()},
                "budgets": self.budgets, "failures": self.failures, "passed": self.passed,
                "machine": self.machine}


class Evaluator:
    """One model and one text; ``run`` evaluates one configuration of exported layers."""

    def __init__(self, weights: str | Path, loaded: LoadedModel, ids: torch.Tensor,
                 runner: str, folder: Path, generate: int, progress: Progress,
                 thread_pool: str = DEFAULT_THREAD_POOL):
        from ..check.runners import get_runner
        self.weights, self.loaded, self.ids = str(weights), loaded, ids
        self.kind = get_runner(runner)
        self.folder, self.generate, self.progress = folder, generate, progress
        self.thread_pool = thread_pool
        self.folders: dict[tuple[str, int], Path] = {}  # each stand-in's artifact folder
        self.reused: set[tuple[str, int]] = set()  # the stand-ins found made, not exported
        self.eager_logits = logits_of(loaded.model, ids)

    def run(self, name: str, options: dict, layers: Sequence[Address],
            time_generation: bool = True) -> RunResult:
        """``time_generation`` False: only the prefill is timed (attribution and per-layer runs:
        their speed is a side figure, and timing generation 6 x 2 times each adds minutes)."""
        stand_ins = {}
        for i, layer in enumerate(layers):
            self.progress(i, len(layers), f"{name}: exporting layer {layer}")
            stand_ins[layer] = self._stand_in(name, options, layer)
        self.progress(len(layers), len(layers), "")
        model = self.loaded.model
        with exported_layers(model, stand_ins):
            for s in stand_ins.values():
                s.reset()
            logits = logits_of(model, self.ids)  # each layer compared with eager's attention
            for s in stand_ins.values():
                s.comparing = False
            generated = greedy(model, self.ids, self.generate, lambda: _reset(stand_ins))
        speed = self._speed(stand_ins, self.generate if time_generation else 0)
        kl = kl_per_position(self.eager_logits, logits)
        agree = float((self.eager_logits.argmax(-1) == logits.argmax(-1)).float().mean())
        details = [LayerDetail(layer, str(self.folders[name, layer]), s.runner.device,
                               *(s.deviations[0] if s.deviations else (float("nan"),) * 2),
                               reused=(name, layer) in self.reused)
                   for layer, s in stand_ins.items()]
        return RunResult(name, options, list(layers), perplexity(logits, self.ids), agree,
                         float(kl.mean()), float(kl.max()), kl.tolist(), speed.exported_prefill,
                         generated, details, speed)

    def _speed(self, stand_ins: dict[Address, ExportedAttention], steps: int) -> Speed:
        """Eager and exported timed alternately in one loop, so that both see the same machine
        (a 2-core host's speed drifts by tens of percent between minutes)."""
        model, ids = self.loaded.model, self.ids

        def exported(call: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                with exported_layers(model, stand_ins):
                    _reset(stand_ins)
                    return call()
            return run

        prefill = lambda: logits_of(model, ids)  # noqa: E731
        timed = {"eager_prefill": prefill, "exported_prefill": exported(prefill)}
        if steps > 1:
            decode = lambda: cached_greedy(model, ids, steps)  # noqa: E731
            timed.update(eager_generation=decode,
                         exported_generation=exported(_incremental(stand_ins, decode)))
        # warm-up (sessions, caches, allocator); the decodes' tokens kept: the timed path
        # must compute what the measured one did
        decoded = {k: call()[0] for k, call in timed.items() if "generation" in k}
        seconds: dict[str, list[float]] = {k: [] for k in timed}
        for _ in range(REPEATS):
            for key, call in timed.items():
                start = time.perf_counter()
                took = call()
                # a decode gives the seconds of its steps alone (its prefill not counted)
                seconds[key].append(took[1] if "generation" in key else
                                    time.perf_counter() - start)
        tokens = {"prefill": len(ids), "generation": steps - 1}
        return Speed(**{k: tokens[k.split("_")[1]] / float(np.median(v))
                        for k, v in seconds.items()},
                     eager_decoded=decoded.get("eager_generation", []),
                     exported_decoded=decoded.get("exported_generation", []),
                     thread_pool=self.thread_pool if self.kind.runtime.startswith(
                         "ONNX Runtime") else "", repeats=REPEATS,
                     torch_openmp=openmp_wait())

    def _folder(self, name: str, layer: int) -> Path:
        return self.folder / _slug(name) / f"layer{layer}"

    def _stand_in(self, name: str, options: dict, layer: int) -> ExportedAttention:
        """The layer's artifact (exported here, or reused when the folder holds one made with
        the same options: an earlier eval's, or a checked `onnx --layers` run's layer-{L}/,
        by its layers.json), opened in the runner."""
        from ..artifact import EVAL_OPTIONS_FILE, read_artifact
        from ..check.runners import RunOptions
        from ..export.pipeline import export_to
        from ..export.fingerprint import checked_layer, export_stamp
        target = target_of_file(self.kind.model_file)
        checked = checked_layer(self.folder, target.name, self.weights, options, layer)
        folder = self.folders[name, layer] = checked or self._folder(name, layer)
        stamp = export_stamp(target.name, self.weights, options, None, layer)
        record = folder / EVAL_OPTIONS_FILE
        if not checked and not (record.is_file() and record.read_text() == stamp
                                and (folder / self.kind.model_file).is_file()):
            export_to(target.name, output=folder, weights=self.weights, layer=layer,
                   validate=False, force=True, **options)
            record.write_text(stamp)
        else:
            self.reused.add((name, layer))
        if reason := self.kind.unavailable():
            raise UsageError(f"--runner {self.kind.name}: {reason}")
        art = read_artifact(folder)
        runner = self.kind.open(art.signature, folder / self.kind.model_file,
                                RunOptions(thread_pool=self.thread_pool))
        original = attention_at(self.loaded.model, layer)
        return ExportedAttention(original, runner, len(self.ids) + self.generate + 1)


def _model_layers_tokens(weights: str | Path, body: str, tokens: int, layers: str,
                         loaded: Optional[LoadedModel]
                         ) -> tuple[LoadedModel, list[Address], torch.Tensor]:
    """The model, the chosen layers and the text's first ``tokens`` ids; the layers and the
    text's length are checked before the model loads (unless it is given)."""
    if loaded is None:
        chosen = chosen_layers(weights, layers)
        tokenizer, block = checked_before_loading(weights, body, tokens, 1, chosen)
        loaded = load_model(weights, tokenizer)
    else:
        chosen = select_layers(layers, len(decoder_layers(loaded.model)),
                               modules=checkpoint_modules(weights))
        block = token_block(loaded.tokenizer, body, tokens, 1)
    return loaded, chosen, torch.from_numpy(block[0])


def chosen_layers(weights: str | Path, spec: str) -> list[Address]:
    """--layers of the checkpoint: its layers' addresses (N, or N.M where a layer holds several
    attention modules)."""
    return select_layers(spec, checkpoint_layers(weights), modules=checkpoint_modules(weights))


def attention_layers(weights: str | Path, chosen: list[Address], spec: str
                     ) -> tuple[list[Address], dict[Address, str]]:
    """The chosen layers that are softmax attention (exported), and the others by type (a
    hybrid model's linear-attention or convolution layers, and KV-shared layers, whose keys
    come from another layer: left to torch)."""
    others = non_attention_layers(weights, chosen, kv_shared=True)
    if len(others) == len(chosen):
        raise UsageError(f"--layers {spec}: none of them is softmax attention")
    return [layer for layer in chosen if layer not in others], others


def claim_exports_folder(folder: Path, weights: str | Path) -> bool:
    """``--exports``: a new or empty folder, eval's own folder of this model, or a checked
    `--layers` folder of this model; anything else is refused before any work, every file
    kept. True where the folder is to be marked as this model's (``mark_exports_folder``)."""
    import json
    from ..artifact import EVAL_EXPORTS_FILE, made_by_us
    from ..export.fingerprint import layers_summary
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--exports {folder}: exists and is not a folder")
    if not (folder.is_dir() and any(folder.iterdir())):
        return True
    kind = made_by_us(folder)
    if kind == "eval-exports":
        owner = json.loads((folder / EVAL_EXPORTS_FILE).read_text()).get("weights")
    elif kind == "layers":
        owner = layers_summary(folder).get("weights")
    else:
        raise UsageError(f"--exports {folder}: not an exports folder of eval or a `--layers` "
                         "run; choose a new or empty folder")
    if owner != str(Path(weights).resolve()):
        raise UsageError(f"--exports {folder}: holds the layers of {owner}, not of "
                         f"{Path(weights).resolve()}; choose another folder")
    return kind == "eval-exports"


def mark_exports_folder(folder: Path, weights: str | Path) -> None:
    from ..artifact import EVAL_EXPORTS_FILE, write_json_atomic
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / EVAL_EXPORTS_FILE, {"weights": str(Path(weights).resolve())})


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def evaluate(weights: str | Path, text: str | Path, tokens: int = 256,
             layers: str = "all", runner: str = "ort-cpu", generate: int = 0,
             options: Optional[dict] = None, folder: str | Path | None = None,
             attribute: bool = False, per_layer: bool = False,
             max_kl: Optional[float] = None, min_top1: Optional[float] = None,
             max_ppl_increase: Optional[float] = None, loaded: Optional[LoadedModel] = None,
             progress: Progress = lambda i, n, s: None,
             thread_pool: str = DEFAULT_THREAD_POOL) -> Evaluation:
    """The exported layers inside the model (module docstring). ``options``: the export
    options of every layer (attention, quantize, kv_cache / static_cache, kv_cache_dtype, ...);
    ``folder``: where the artifacts are written (kept, and reused by a later run with the same
    options); budgets fail the evaluation (``Evaluation.failures``); ``thread_pool``: how the
    layers' ONNX Runtime sessions share the cores (check/runners/ort_threads.py)."""
    import tempfile
    from ..env import machine_info
    options = dict(options or {})
    unknown = sorted(set(options) - set(EXPORT_KEYS))
    if unknown:
        raise UsageError(f"eval: unknown export option {unknown[0]!r}")
    _require_target_of(options, runner)
    for name, value in (("--max-kl", max_kl), ("--min-top1", min_top1),
                        ("--max-ppl-increase", max_ppl_increase)):
        if value is not None and not (np.isfinite(value) and value >= 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {value}")
    if generate < 0:
        raise UsageError(f"--generate must be >= 0, got {generate}")
    get_policy(thread_pool)  # an unknown policy refused before any work
    if generate and not (options.get("kv_cache") or options.get("static_cache")):
        options["kv_cache"] = True  # generation steps run the decode artifacts
    runs = lossy.attribution(options, runner) if attribute else []  # refused before any work
    mark = folder is not None and claim_exports_folder(Path(folder), weights)
    chosen, others = attention_layers(weights, chosen_layers(weights, layers), layers)
    _preflight(weights, runner, options, chosen[0])  # what an export would refuse, now
    loaded, _, ids = _model_layers_tokens(weights, read_text(text), tokens, layers, loaded)
    with contextlib.ExitStack() as stack:
        where = Path(folder) if folder is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="mha-eval-")))
        if mark:
            mark_exports_folder(where, weights)
        ev = Evaluator(weights, loaded, ids, runner, where, generate, progress, thread_pool)
        with torch.inference_mode():
            reference = float(torch.exp(loaded.model(input_ids=ids[None], labels=ids[None],
                                                     use_cache=False).loss))
        eager_generated = greedy(loaded.model, ids, generate, lambda: None)
        main = ev.run("exported", options, chosen)
        result = Evaluation(str(weights), str(text), tokens, runner,
                            perplexity(ev.eager_logits, ids), main.speed.eager_prefill, main,
                            eager_generated, transformers_perplexity=reference,
                            left_to_model=others, machine=machine_info())
        if attribute:
            result.attribution = [ev.run(name, opts, chosen, time_generation=False)
                                  for name, opts in runs]
        if per_layer:
            result.per_layer = [ev.run(f"layer {layer} alone", options, [layer],
                                       time_generation=False) for layer in chosen]
    result.budgets = {"max_kl": max_kl, "min_top1": min_top1,
                      "max_ppl_increase": max_ppl_increase}
    result.failures = _over_budget(result, max_kl, min_top1, max_ppl_increase)
    return result


def _over_budget(r: Evaluation, max_kl: Optional[float], min_top1: Optional[float],
                 max_ppl_increase: Optional[float]) -> list[str]:
    """Each budget the exported run missed (a NaN never meets one)."""
    m, increase = r.main, r.main.perplexity / r.eager_perplexity - 1
    checks = [("kl_mean", m.kl_mean, max_kl, lambda v, b: v <= b),
              ("top1_agreement", m.top1_agreement, min_top1, lambda v, b: v >= b),
              ("ppl_increase", increase, max_ppl_increase, lambda v, b: v <= b)]
    return [f"{name} {value:.4g} (budget {budget:g})" for name, value, budget, ok in checks
            if budget is not None and not (np.isfinite(value) and ok(value, budget))]
