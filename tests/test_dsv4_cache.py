"""DeepSeek-V4's cached call through the product (--kv-cache; kinds/dsv4/settings.py's
cache_tensors): the signature's cache (past_key the last window - 1 key = value rows, no
past_value; a compressed layer's compressor and indexer state, past_<cache>.<entry>), the
three layer types exported to ONNX and TorchScript and the sliding one to AOTInductor, each
one's check passing; each artifact, from an empty cache, on transformers' left-padded 40-token
prompt and 8 one-token steps with its DynamicCache (windows close within them: CSA's at tokens
44 and 48, HCA's at 48), gives transformers' module's y (CSA: on the queries without a tie on
the indexer's top-k boundary, whose pick transformers' torch.topk leaves unspecified), and its
final cache tensors equal transformers' cache; planted faults (a compressor buffer not
carried, a sliding cache one row too long) fail the check; eval runs the cached artifacts
inside the model; the C++ programs mha_ort and mha_torch run the cached
artifacts; what is not built is one line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mha_export.artifact import read_artifact
from mha_export.check.scenarios import empty_cache
from mha_export.cli.commands import cli
from mha_export.comparison.torch_runners import TorchScriptRunner
from mha_export.kinds.dsv4 import graph, graph_compressed
from mha_export.kinds.dsv4.settings import state_keys
from mha_export.signature import Signature, signature_from_meta
from dsv4_layers import read_layer, with_ties
from mha_export.check.sweep import Case
from test_cpp import assert_outputs_match, read_outputs, run, write_case_dirs
from test_cpp import binaries  # noqa: F401 (the C++ programs, a fixture)
from test_dsv4 import LAYER_TYPES, LENGTH, _hooked, _prompt, _saved

pytest.importorskip("transformers")

SLIDING, CSA, HCA = 0, 1, 2
ARTIFACTS = [("onnx", SLIDING), ("onnx", CSA), ("onnx", HCA), ("torchscript", SLIDING),
             ("torchscript", CSA),
             ("torchscript", HCA), ("aoti", SLIDING)]
STEPS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _saved(tmp_path_factory)


def _export(folder: Path, target: str, layer: int, out: Path) -> list[str]:
    """``mha-export TARGET --weights DIR --layer L --kv-cache -o OUT``: (exit code, output)."""
    r = CliRunner().invoke(cli, [target, "--weights", str(folder), "--layer", str(layer),
                                 "--kv-cache", "-o", str(out)])
    return [r.exit_code, r.output + r.stderr]


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """(target, layer) -> the folder --kv-cache wrote; its export-time check passed."""
    _, folder = tiny
    root, out = tmp_path_factory.mktemp("kv"), {}
    for target, layer in ARTIFACTS:
        code, text = _export(folder, target, layer, root / f"{target}-{layer}")
        assert code == 0 and "PASS" in text, text
        out[target, layer] = root / f"{target}-{layer}"
    return out


def _runner(target: str, folder: Path):
    """The artifact's call: feeds -> outputs by name."""
    sig = read_artifact(folder).signature
    if target == "onnx":
        import onnxruntime as ort
        session = ort.InferenceSession(str(folder / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        return lambda feeds: dict(zip(sig.output_names, session.run(None, feeds)))
    if target == "aoti":
        from mha_export.targets.aoti.runner import AotiRunner
        return AotiRunner(sig, folder / "model.pt2").run
    return TorchScriptRunner(sig, folder / "model.pt").run


def test_the_signature_names_the_cache(exported):
    """No past_value: past_key, then the layer type's state in state_keys' order, before
    position_ids; config.json's io reads back as the same signature, its axes named."""
    for (target, layer), folder in exported.items():
        art = read_artifact(folder)
        sig, keys = art.signature, state_keys(LAYER_TYPES[layer])
        assert sig.input_names == ["x", "attention_mask", "past_key",
                                   *("past_" + k for k in keys), "position_ids"]
        assert sig.output_names == ["y", "present_key", *("present_" + k for k in keys)]
        assert signature_from_meta(art.config, art.meta) == sig
        assert art.meta["io"]["inputs"][2]["shape"] == ["batch", 1, "min(past_seq, window - 1)",
                                                        32]
    assert len(state_keys(LAYER_TYPES[CSA])) == 10 and len(state_keys(LAYER_TYPES[HCA])) == 3


def _transformers_calls(model, layer: int) -> tuple[list, object]:
    """[(x, attention_mask, position_ids, transformers' y)] of the padded prompt and STEPS
    one-token steps with transformers' cache (positions: transformers', the padding counted),
    and that cache's layer after them."""
    ids, keep = _prompt()
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=keep, use_cache=True).past_key_values
    x, y = _hooked(model, layer, input_ids=ids, attention_mask=keep, use_cache=False)
    calls = [(x, keep, torch.arange(LENGTH).expand(2, LENGTH), y)]
    for step in range(STEPS):
        keep = torch.cat([keep, torch.ones(2, 1, dtype=torch.long)], 1)
        x1, y1 = _hooked(model, layer, input_ids=torch.tensor([[5 + step], [9]]),
                         past_key_values=cache, use_cache=True, attention_mask=keep)
        calls.append((x1, keep, torch.full((2, 1), LENGTH + step), y1))
    return calls, cache.layers[layer]


def _untied(eager, calls: list) -> list[torch.Tensor]:
    """Per call, (B, T) bool: the queries without a tie on the indexer's top-k boundary (all of
    them without an indexer), from the eager layer over the same calls, its cache carried."""
    x, keep, positions, _ = calls[0]
    (_, past, past_keep, state), tied = with_ties(eager, x, keep, positions)
    untied = [~tied]
    for x, _, positions, _ in calls[1:]:
        (_, past, past_keep, state), tied = with_ties(
            eager, x, positions=positions, past=past, past_keep=past_keep, state=state)
        untied.append(~tied)
    return untied


def _carried(run, sig: Signature, calls: list) -> tuple[list, dict]:
    """The artifact called on each of ``calls`` from an empty cache, every present_* fed back
    as past_*: its y per call and its last outputs."""
    past, ys, out = empty_cache(sig, 2), [], {}
    for x, keep, positions, _ in calls:
        out = run({"x": x.numpy(), "attention_mask": keep.numpy(), **past,
                   "position_ids": positions.contiguous().numpy()})
        ys.append(out["y"])
        past = {p: out[q] for p, q in sig.cache_pairs}
    return ys, out


def _held(cache_layer, key: str, like: np.ndarray) -> np.ndarray:
    """transformers' cache entry of a state key ('compressor.buffer_kv': its buffer_kv
    ["compressor"]); unset (None): 0 rows of ``like``'s width."""
    cache, entry = key.split(".")
    held = getattr(cache_layer, entry)[cache]
    return np.zeros((like.shape[0], 0, like.shape[2])) if held is None else held.numpy()


@pytest.mark.parametrize("target, layer", ARTIFACTS)
def test_prefill_and_decode_steps_equal_transformers_with_its_cache(tiny, exported, target,
                                                                    layer):
    """y of every real query of the prompt and of every step, and the final present_key (the
    last window - 1 rows) and state (buffers, pooled rows, CSA's overlap and indexer's) equal
    transformers' module's and cache's."""
    model, folder = tiny
    calls, cache = _transformers_calls(model, layer)
    sig = read_artifact(exported[target, layer]).signature
    ys, last = _carried(_runner(target, exported[target, layer]), sig, calls)
    compared = _untied(read_layer(folder, layer), calls)
    compared[0] &= calls[0][1].bool()  # the prompt's real tokens
    errors = [np.abs(y - call[3].numpy())[rows.numpy()].max(initial=0)
              for y, call, rows in zip(ys, calls, compared)]
    assert max(errors) <= 2e-5, errors
    assert sum(int(rows.sum()) for rows in compared) >= 60  # most queries are compared
    assert np.abs(last["present_key"] - cache.keys.numpy()).max() <= 1e-5
    for key in state_keys(LAYER_TYPES[layer]):
        got = last["present_" + key]
        want = _held(cache, key, got)
        assert got.shape == want.shape and np.abs(got - want).max(initial=0) <= 1e-5, key


def _buffer_not_read(monkeypatch) -> None:
    """The compressor's past buffer not read: the carried tokens of an open window lost."""
    windows = graph_compressed.complete_windows

    def dropped(g, kv, gate, rate, past, present, name):
        if past is not None:
            zero = g.ints("fault_zero", [0])
            past = {**past, **{k: graph_compressed.Ops(g).Slice(
                past[k], zero, zero, g.ints("fault_axes1", [1])) for k in ("buffer_kv",
                                                                          "buffer_gate")}}
        return windows(g, kv, gate, rate, past, present, name)
    monkeypatch.setattr(graph_compressed, "complete_windows", dropped)


def _one_row_too_many(monkeypatch) -> None:
    """The sliding cache keeps window rows, not window - 1."""
    rows = graph._last_rows
    monkeypatch.setattr(graph, "_last_rows", lambda g, kv, count: rows(g, kv, count + 1))


@pytest.mark.parametrize("plant, layer", [(_buffer_not_read, HCA), (_one_row_too_many, SLIDING)])
def test_a_planted_fault_fails_the_check(tiny, tmp_path, monkeypatch, plant, layer):
    _, folder = tiny
    plant(monkeypatch)
    code, text = _export(folder, "onnx", layer, tmp_path / "x")
    assert code != 0 and "FAIL" in text, text


@pytest.mark.parametrize("args, layer, says", [
    (["torchscript", "--static-cache"], HCA,
     "--static-cache is not built for DeepSeek-V4 attention yet: its cache is more than one key"),
    (["aoti", "--kv-cache"], HCA, "heavily_compressed_attention layer's --kv-cache call is not "
                                  "built for AOTInductor: its compressor closes"),
    (["executorch", "--kv-cache"], SLIDING, "a growing cache cannot live inside an ExecuTorch"),
])
def test_what_is_not_built_is_one_line(tiny, tmp_path, args, layer, says):
    _, folder = tiny
    r = CliRunner().invoke(cli, [*args, "--weights", str(folder), "--layer", str(layer), "-o",
                                 str(tmp_path / "x")])
    errors = [line for line in r.stderr.splitlines() if not line.startswith("note:")]
    assert r.exit_code == 2 and len(errors) == 1 and says in errors[0], r.stderr
    assert not (tmp_path / "x").exists()


def test_eval_runs_the_cached_layers_inside_the_model(tiny, tmp_path):
    """eval with --kv-cache artifacts (ONNX: sliding, CSA, HCA; TorchScript: CSA), each layer's
    cache its own, carried call after call inside transformers' model (12 generated tokens
    too): nothing the model would notice."""
    import hybrid
    from mha_export.model.eval import evaluate
    _, folder = tiny
    hybrid.save_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog, again and again. " * 4)
    for runner, layers in (("ort-cpu", "0,1,2"), ("torchscript", "1")):
        d = evaluate(folder, text, 20, layers, runner=runner, options={"kv_cache": True},
                     folder=tmp_path / runner, generate=12).to_dict()
        assert [str(x["layer"]) for x in d["layers"]] == layers.split(",")
        assert d["exported"]["kl_max"] < 1e-6 and all(x["rel"] < 1e-4 for x in d["layers"])


@pytest.mark.parametrize("target, layer", [("onnx", CSA), ("onnx", HCA), ("torchscript", CSA),
                                           ("torchscript", SLIDING)])
def test_the_cpp_programs_run_the_cached_artifacts(binaries, exported, tmp_path, target,
                                                    layer):
    """mha_ort and mha_torch (cpp/, `make cpp`) feed and fetch every cache tensor by name (a
    TorchScript step returns a list) and give the Python runner's outputs: a prompt over an
    empty cache, a step and a chunk after 13 tokens (a window open, pooled rows carried)."""
    folder = exported[target, layer]
    program = binaries["ort" if target == "onnx" else "torch"]
    dirs = write_case_dirs(tmp_path, folder, [Case(2, 9), Case(2, 1, 13), Case(1, 3, 13)])
    model = folder / ("model.onnx" if target == "onnx" else "model.pt")
    r = run(program, model, *[d for d, _, _ in dirs])
    assert r.returncode == 0, r.stderr
    sig = read_artifact(folder).signature
    for d, case, feeds in dirs:
        want = _runner(target, folder)(feeds)
        assert_outputs_match(read_outputs(d, sig), want, feeds, case, program.name)
