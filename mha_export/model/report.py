"""Rendering an ``Evaluation`` (eval.py): the terminal summary and the per-token KL plot. The
JSON form is ``Evaluation.to_dict``."""
from __future__ import annotations

import math
from pathlib import Path

from .eval import Evaluation, RunResult


def _row(name: str, r: RunResult, eager_ppl: float) -> str:
    increase = r.perplexity / eager_ppl - 1
    return (f"{name:44s} {r.perplexity:10.4f} {increase:+10.4%} {r.top1_agreement:8.4f} "
            f"{r.kl_mean:10.3e} {r.kl_max:10.3e} {r.tokens_per_s:9.1f}")


def _kinds(layers: dict[int, str]) -> str:
    """{0: "conv", 2: "conv", 3: "linear_attention"} -> "conv 0, 2; linear_attention 3"."""
    kinds = sorted(set(layers.values()))
    return "; ".join(f"{k} " + ", ".join(str(i) for i, v in layers.items() if v == k)
                     for k in kinds)


def format_evaluation(ev: Evaluation) -> str:
    head = (f"{'':44s} {'perplexity':>10s} {'vs eager':>10s} {'top-1':>8s} {'KL mean':>10s} "
            f"{'KL max':>10s} {'tokens/s':>9s}")
    reused = sum(d.reused for d in ev.main.details)
    made = f"{len(ev.main.layers) - reused} layer(s) exported" + (
        f", {reused} reused from --exports" if reused else "") + (
        f", {len(ev.left_to_model)} left to the model ({_kinds(ev.left_to_model)})"
        if ev.left_to_model else "")
    lines = [f"{ev.weights}: {made}, {ev.tokens} tokens of "
             f"{ev.text}, runner {ev.runner}", head, "-" * len(head),
             f"{'eager (transformers)':44s} {ev.eager_perplexity:10.4f} {'':10s} {'':8s} "
             f"{'':10s} {'':10s} {ev.eager_tokens_per_s:9.1f}",
             _row("exported", ev.main, ev.eager_perplexity)]
    lines += [_row(f"  {r.name}", r, ev.eager_perplexity) for r in ev.attribution]
    lines += [_row(f"  {r.name}", r, ev.eager_perplexity) for r in ev.per_layer]
    if sp := ev.main.speed:
        ratios = sp.ratios()
        pool = f"ONNX Runtime thread pool: {sp.thread_pool}; " if sp.thread_pool else ""
        lines.append(f"speed (median of {sp.repeats} runs each, eager and exported in turn; "
                     f"{pool}torch's OpenMP wait: "
                     f"{sp.torch_openmp or 'not recorded'}): prefill eager "
                     f"{sp.eager_prefill:.1f}, exported {sp.exported_prefill:.1f} tokens/s "
                     f"({ratios['prefill']:.2f}x)" + (
                         f"; generation eager {sp.eager_generation:.2f}, exported "
                         f"{sp.exported_generation:.2f} tokens/s ({ratios['generation']:.2f}x)"
                         if math.isfinite(sp.exported_generation) else ""))
    gen = ev.generation()
    if gen["tokens"]:
        lines.append(f"greedy generation: {gen['matched']} of {gen['tokens']} tokens match "
                     "eager's before the first difference")
    worst = sorted(ev.main.details, key=lambda d: -d.rel)[:3]
    lines.append("layers furthest from eager attention (max|d| / max|y| on the hidden states "
                 "they received): " + ", ".join(f"{d.layer}: {d.rel:.2e}" for d in worst))
    lines.append(f"ran on: {ev.main.details[0].runner}" if ev.main.details else "")
    lines.append(f"{'PASS' if ev.passed else 'FAIL'}" + (
        f": {'; '.join(ev.failures)}" if ev.failures else
        " (no budget set)" if not any(v is not None for v in ev.budgets.values()) else ""))
    return "\n".join(line for line in lines if line)


def plot_evaluation(ev: Evaluation, path: str | Path) -> Path:
    """Per-token KL(eager || exported) of the run, and of each attribution step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in [ev.main, *ev.attribution]:
        ax.plot(range(len(r.kl)), [max(v, 1e-12) for v in r.kl], lw=1, label=r.name)
    ax.set_yscale("log")
    ax.set_xlabel("position in the text (token)")
    ax.set_ylabel("KL(eager || exported), nats")
    ax.set_title(f"{Path(ev.weights).name}: {len(ev.main.layers)} exported layer(s), "
                 f"{ev.runner}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    partial.replace(path)
    return path
