"""DeepSeek-V4's ONNX graph (mha_export/kinds/dsv4/graph.py), full-sequence call with a padding
mask, in ONNX Runtime's CPU provider against the eager layer (which tests/test_dsv4.py proves
against transformers 5.23) and transformers' own y: every layer type on the left-padded 40-token
prompt of test_dsv4 (window 8 acting; CSA 10 closed rows, the indexer keeping 3; HCA 5 closed
rows), two other batch sizes and lengths through the same model (dynamic axes, one of them
shorter than a window), and a planted fault per feature failing. The cached calls: the sliding
layer's (past_key), the compressed layers' (past_key and the compressor's, CSA's indexer's
state: graph_state.py) over a prompt, a chunk and 8 one-token steps in which windows close,
every state output compared too, two other batch sizes, and a planted fault per state feature.

CSA's ties: the indexer's ReLU makes exact-zero scores, and where the k-th and (k + 1)-th
closed rows of a query score the same, the eager layer keeps the earlier row (compressed.py's
``top_rows``), as ONNX TopK does: every query is compared against the eager layer, the tied
ones included (a planted later-row tie-break fails). Against transformers, whose torch.topk
picks among equal scores in no specified order, a tied query is not compared (``with_ties``,
tests/dsv4_layers.py); with 8 index heads instead of 2 no query of the prompt has such a tie.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mha_export.errors import UsageError
from mha_export.graph.builder import GraphBuilder
from mha_export.graph.ops import Ops
from dsv4_layers import read_layer, with_ties
from mha_export.kinds.dsv4 import compressed, graph, graph_compressed, graph_state
from mha_export.kinds.dsv4.graph import dsv4_model

from test_dsv4 import _config, _transformers_y, tiny, tiny_yarn  # noqa: F401

SLIDING, CSA, HCA = 0, 1, 2  # the tiny model's layers
TOLERANCE = 1e-5


def _onnx_y(layer, x: torch.Tensor, keep: torch.Tensor, positions: torch.Tensor
            ) -> torch.Tensor:
    import onnxruntime as ort
    model = dsv4_model(layer.shape, layer.state_dict())
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": x.numpy(), "attention_mask": keep.numpy(), "position_ids": positions.numpy()}
    return torch.from_numpy(session.run(["y"], feeds)[0])


def _positions(keep: torch.Tensor) -> torch.Tensor:
    """transformers' position_ids of a left-padded batch without them: 0 .. T - 1."""
    return torch.arange(keep.size(1)).expand(keep.size(0), -1).contiguous()


def _errors(layer, x, keep) -> tuple[float, torch.Tensor]:
    """(max |ONNX y - eager y| over every query, the ones tied on their indexer's top-k
    boundary (B, T))."""
    positions = _positions(keep)
    (want, *_), tied = with_ties(layer, x, keep, positions)
    got = _onnx_y(layer, x, keep, positions)
    return float((got - want).abs().max()), tied


@pytest.mark.parametrize("index", [SLIDING, CSA, HCA])
def test_each_layer_type_equals_eager_and_transformers_on_a_left_padded_prompt(
        tiny, index):  # noqa: F811
    model, folder = tiny
    x, keep, expected = _transformers_y(model, index)
    layer = read_layer(folder, index)
    error, tied = _errors(layer, x, keep)
    assert error <= TOLERANCE  # every query, the tied ones too
    got = _onnx_y(layer, x, keep, _positions(keep))
    rows = keep.bool() & ~tied  # transformers' picks among equal scores: unspecified
    assert float((got - expected)[rows].abs().max()) <= 2e-5
    if index == CSA:  # the prompt has tied queries (their y compared above), not too many
        assert 0 < tied.sum() <= 0.3 * tied.numel(), tied.nonzero().tolist()


@pytest.mark.parametrize("index", [SLIDING, CSA, HCA])
def test_a_yarn_compress_rope_equals_eager(tiny_yarn, index):  # noqa: F811
    """The released checkpoints' "compress" rope (YaRN) on the compressed layers' queries,
    keys, pooled rows, index queries and keys; the sliding layer's stays default."""
    model, folder = tiny_yarn
    x, keep, _ = _transformers_y(model, index)
    layer = read_layer(folder, index)
    assert layer.shape.rope_scaling or index == SLIDING
    assert _errors(layer, x, keep)[0] <= TOLERANCE


def test_the_compress_rope_built_without_its_yarn_fails(tiny_yarn, monkeypatch):  # noqa: F811
    model, folder = tiny_yarn
    x, keep, _ = _transformers_y(model, HCA)
    layer = read_layer(folder, HCA)
    with monkeypatch.context() as patch:
        for module in (graph, graph_compressed):
            at = module.cos_sin_at
            patch.setattr(module, "cos_sin_at", lambda g, pos, dim, theta, scaling, at=at: at(
                g, pos, dim, theta, None))
        assert _errors(layer, x, keep)[0] > 1e-3


def _saved_with_index_heads(tmp_path_factory, heads: int):
    """test_dsv4's tiny model, its indexer with ``heads`` heads (transformers' config)."""
    from transformers import AutoModelForCausalLM
    config = _config()
    config.index_n_heads = heads
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith(("sinks", "norm.weight")):
                t.copy_(torch.randn_like(t) * 0.5 + (0 if name.endswith("sinks") else 1))
    folder = tmp_path_factory.mktemp("dsv4_index")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def eight_heads(tmp_path_factory):
    """The tiny model, its indexer with 8 heads (no top-k tie in the prompt)."""
    return _saved_with_index_heads(tmp_path_factory, 8)


def test_csa_with_eight_index_heads_equals_eager_on_every_query(eight_heads):
    """No tie on the top-k boundary with 8 index heads: every query of the prompt compared."""
    model, folder = eight_heads
    x, keep, expected = _transformers_y(model, CSA)
    layer = read_layer(folder, CSA)
    assert layer.shape.index_heads == 8
    error, tied = _errors(layer, x, keep)
    assert not bool(tied.any()) and error <= TOLERANCE
    got = _onnx_y(layer, x, keep, _positions(keep))
    assert float((got - expected)[keep.bool()].abs().max()) <= 2e-5


@pytest.mark.parametrize("index", [SLIDING, CSA, HCA])
def test_one_model_takes_other_batch_sizes_and_lengths(tiny, index):  # noqa: F811
    """The same model (batch and seq dynamic): 1 x 3 (no window closed, no pooled row),
    3 x 29 (each row its own left padding), 1 x 17 (no padding)."""
    import onnxruntime as ort
    _, folder = tiny
    layer = read_layer(folder, index)
    session = ort.InferenceSession(dsv4_model(layer.shape, layer.state_dict())
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    torch.manual_seed(2)
    for batch, length, pads in ((1, 3, [1]), (3, 29, [0, 5, 11]), (1, 17, [0])):
        x = torch.randn(batch, length, layer.shape.dim)
        keep = torch.ones(batch, length, dtype=torch.long)
        for row, pad in enumerate(pads):
            keep[row, :pad] = 0
        positions = _positions(keep)
        with torch.no_grad():
            want = layer(x, keep, positions)[0]
        got = session.run(["y"], {"x": x.numpy(), "attention_mask": keep.numpy(),
                                  "position_ids": positions.numpy()})[0]
        assert got.shape == (batch, length, layer.shape.dim)
        assert np.abs(got - want.numpy()).max() <= TOLERANCE, (batch, length)


# --- planted faults: each one's graph code patched while the model is built ------------------

def _sinks_dropped(monkeypatch):
    attend = graph._attend
    monkeypatch.setattr(graph, "_attend", lambda g, s, w, q, kv, bias: attend(
        g, s, {**w, "sinks": torch.full_like(w["sinks"], float("-inf"))}, q, kv, bias))


def _window_ignored(monkeypatch):
    bias = graph._sliding_bias
    monkeypatch.setattr(graph, "_sliding_bias", lambda g, s, keep, positions, keys: bias(
        g, dataclasses.replace(s, window=10 ** 6), keep, positions, keys))


def _padding_ignored(monkeypatch):
    bias = graph._sliding_bias
    monkeypatch.setattr(graph, "_sliding_bias", lambda g, s, keep, positions, keys: bias(
        g, s, Ops(g).Add(Ops(g).Mul(keep, g.ints("none", 0)), g.ints("all", 1)), positions,
        keys))


def _inverse_rotary_dropped(monkeypatch):
    rotate = graph.rotate_tail
    monkeypatch.setattr(graph, "rotate_tail", lambda g, x, *args: x if args[-1] == "unrotate"
                        else rotate(g, x, *args))


def _output_groups_swapped(monkeypatch):
    grouped = graph._grouped_output

    def swapped(g, s, w, o):  # o_a_proj's two groups of rows swapped
        wa = w["o_a_proj.weight"]
        return grouped(g, s, {**w, "o_a_proj.weight": torch.cat(wa.chunk(2)[::-1])}, o)
    monkeypatch.setattr(graph, "_grouped_output", swapped)


def _pooled_causality_ignored(monkeypatch):
    closed = graph_compressed.closed_by
    monkeypatch.setattr(graph_compressed, "closed_by", lambda g, positions, rows, rate: closed(
        g, Ops(g).Add(positions, g.ints("far", 10 ** 6)), rows, rate))


def _pooled_rotary_dropped(monkeypatch):
    rotate = graph_compressed.rotate_tail
    monkeypatch.setattr(graph_compressed, "rotate_tail", lambda g, x, *args: x if args[-1]
                        == "compressor_rope" else rotate(g, x, *args))


def _indexer_ignored(monkeypatch):
    monkeypatch.setattr(graph_compressed, "index_picks", lambda g, s, w, x, residual, closed,
                        cos, sin, past=None: (closed, {}))


def _overlap_dropped(monkeypatch):
    overlapped = graph_compressed._overlapped

    def dropped(g, t, width, fill, name, prior=None):  # every window's first series: the fill
        first = Ops(g).Mul(t, g.const("first_dropped", np.array([0.0] * width + [1.0] * width)))
        return overlapped(g, first, width, fill, name, prior) if fill == 0.0 else overlapped(
            g, t, width, fill, name, prior)
    monkeypatch.setattr(graph_compressed, "_overlapped", dropped)


# fault -> (how it is planted, the layer where it acts)
FAULTS = {"sinks dropped": (_sinks_dropped, SLIDING), "window ignored": (_window_ignored, SLIDING),
          "padding ignored": (_padding_ignored, SLIDING),
          "inverse rotary dropped": (_inverse_rotary_dropped, SLIDING),
          "output groups swapped": (_output_groups_swapped, SLIDING),
          "pooled rows' causality ignored": (_pooled_causality_ignored, HCA),
          "pooled rows' rotary dropped": (_pooled_rotary_dropped, HCA),
          "indexer ignored": (_indexer_ignored, CSA),
          "window overlap dropped": (_overlap_dropped, CSA)}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_fails(tiny, fault, monkeypatch):  # noqa: F811
    model, folder = tiny
    plant, index = FAULTS[fault]
    x, keep = _transformers_y(model, index)[:2]
    layer = read_layer(folder, index)
    with monkeypatch.context() as patch:
        plant(patch)
        error, _ = _errors(layer, x, keep)
    assert error > 1e-3


def _later_ties(scores, closed, k, pick=compressed.top_rows):  # ties to the later row
    return pick(scores.flip(-1), closed.flip(-1), k).flip(-1)  # the rows' order reversed


# the eager selection (compressed.py's top_rows) changed: the ONNX graph no longer equals it
SELECTION_FAULTS = {"ties to the later row": _later_ties,
                    "k one more": lambda s, c, k, pick=compressed.top_rows: pick(s, c, k + 1),
                    "k one less": lambda s, c, k, pick=compressed.top_rows: pick(s, c, k - 1)}


@pytest.mark.parametrize("fault", SELECTION_FAULTS)
def test_a_planted_fault_in_the_eager_selection_fails(tiny, fault, monkeypatch):  # noqa: F811
    """On the tiny CSA prompt (its tied queries compared too): a later-row tie-break differs
    from ONNX TopK's on those queries, k off by one on most."""
    model, folder = tiny
    x, keep = _transformers_y(model, CSA)[:2]
    layer = read_layer(folder, CSA)
    monkeypatch.setattr(compressed, "top_rows", SELECTION_FAULTS[fault])
    assert _errors(layer, x, keep)[0] > 1e-3


# --- the sliding layer's cached call ------------------------------------------------------------

def test_the_sliding_layers_cached_calls_equal_eager(tiny):  # noqa: F811
    """The cached model (past_key: the rotated key = value rows, at most window - 1): the
    left-padded prompt from an empty past, then a 5-token chunk, then 8 one-token steps, the
    attention_mask the whole history (its last past_seq + seq columns read); y and
    present_key equal the eager layer's at every call."""
    import onnxruntime as ort
    model, folder = tiny
    x, keep = _transformers_y(model, SLIDING)[:2]
    layer = read_layer(folder, SLIDING)
    onnx_model = dsv4_model(layer.shape, layer.state_dict(), cached=True)
    session = ort.InferenceSession(onnx_model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    past, past_keep, mask = torch.zeros(2, 1, 0, layer.shape.head_dim), None, keep[:, :0]
    torch.manual_seed(3)
    chunks = [(x, keep)] + [(torch.randn(2, t, layer.shape.dim),
                             torch.ones(2, t, dtype=torch.long)) for t in [5] + [1] * 8]
    for step, (xs, ks) in enumerate(chunks):
        positions = torch.arange(mask.size(1), mask.size(1) + xs.size(1)).expand(2, -1)
        mask = torch.cat([mask, ks], dim=1)
        with torch.no_grad():
            y, present, past_keep, _ = layer(xs, ks, positions.contiguous(),
                                             None if step == 0 else past, past_keep)
        got_y, got_present = session.run(["y", "present_key"], {
            "x": xs.numpy(), "attention_mask": mask.numpy(), "past_key": past.numpy(),
            "position_ids": positions.contiguous().numpy()})
        assert np.abs(got_y - y.numpy()).max() <= TOLERANCE, step
        assert got_present.shape == present.shape and np.abs(
            got_present - present.numpy()).max() <= TOLERANCE, step
        past = torch.from_numpy(got_present)


def test_the_sliding_cached_builder_refuses_a_compressed_layer(tiny):  # noqa: F811
    _, folder = tiny
    layer = read_layer(folder, HCA)
    with pytest.raises(UsageError, match="dsv4_cached"):
        graph.dsv4_sliding_cached(GraphBuilder(), layer.shape, layer.state_dict(), "x",
                                  "attention_mask", "position_ids", "past_key")


# --- the compressed layers' cached calls ---------------------------------------------------------

def _session(layer):
    import onnxruntime as ort
    model = dsv4_model(layer.shape, layer.state_dict(), cached=True)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _empty_state(layer, batch: int) -> dict[str, np.ndarray]:
    """The first call's state inputs: every symbolic axis (buffer, rows, overlap) 0 long."""
    return {key: np.zeros([0 if isinstance(d, str) else d for d in dims], np.float32)
            for key, dims in graph_state.state_shapes(layer.shape, batch).items()}


def _state_error(got: np.ndarray, want) -> float:
    """max |got - want|; inf when the shapes differ (``want`` None: no entry, 0 rows)."""
    want = np.zeros(got.shape[:1] + (0,) + got.shape[2:]) if want is None else want.numpy()
    return float(np.abs(got - want).max(initial=0.0)) if got.shape == want.shape else np.inf


def _cached_errors(layer, session, chunks) -> tuple[list, list, int]:
    """Each call of ``chunks`` ((x, keep) pairs, the mask growing with them) through the eager
    layer and the cached model, the model fed its own outputs: (per call, max |y| error over
    every query, the tied ones too; per call, the max state error over present_key and every
    state output; how many queries were tied on their indexer's top-k boundary)."""
    batch = chunks[0][0].size(0)
    past, past_keep, state, mask = None, None, None, chunks[0][1][:, :0]
    feeds = {"past_key": np.zeros((batch, 1, 0, layer.shape.head_dim), np.float32),
             **{"past_" + k: v for k, v in _empty_state(layer, batch).items()}}
    names = [o.name for o in session.get_outputs()]
    y_errors, state_errors, tied = [], [], 0
    for xs, ks in chunks:
        positions = torch.arange(mask.size(1), mask.size(1) + xs.size(1)).expand(batch, -1)
        mask = torch.cat([mask, ks], dim=1)
        (y, past, past_keep, state), ties = with_ties(
            layer, xs, ks, positions.contiguous(), past, past_keep, state)
        got = dict(zip(names, session.run(None, {
            **feeds, "x": xs.numpy(), "attention_mask": mask.numpy(),
            "position_ids": positions.contiguous().numpy()})))
        y_errors.append(float(np.abs(got["y"] - y.numpy()).max()))
        state_errors.append(max([_state_error(got["present_key"], past)] + [
            _state_error(got["present_" + k], state.get(k))
            for k in graph_state.state_keys(layer.shape.layer_type)]))
        tied += int(ties.sum())
        feeds = {n.replace("present_", "past_"): v for n, v in got.items() if n != "y"}
    return y_errors, state_errors, tied


def _decode_chunks(x: torch.Tensor, keep: torch.Tensor, chunk: int = 5, steps: int = 8):
    """The prompt, then a ``chunk``-token call, then ``steps`` one-token calls (random x)."""
    torch.manual_seed(3)
    batch, dim = x.size(0), x.size(2)
    return [(x, keep)] + [(torch.randn(batch, t, dim), torch.ones(batch, t, dtype=torch.long))
                          for t in [chunk] + [1] * steps]


def _layer_and_prompt(request, index, source: str = ""):
    """(eager layer, prompt x, keep): from the ``source`` fixture's model; by default HCA's
    from the tiny model, CSA's from the 8-index-head one."""
    source = source or ("eight_heads" if index == CSA else "tiny")
    model, folder = request.getfixturevalue(source)
    x, keep = _transformers_y(model, index)[:2]
    return read_layer(folder, index), x, keep


@pytest.mark.parametrize("index, source, tied", [(CSA, "eight_heads", False),
                                                  (CSA, "tiny", True), (HCA, "tiny", False)])
def test_the_compressed_layers_cached_calls_equal_eager(request, index, source, tied):
    """The left-padded 40-token prompt from an empty state, a 5-token chunk (a window closes
    in its middle, a token left in the buffer), then 8 one-token steps (CSA: windows close at
    the 3rd and 7th, each after a non-empty buffer; HCA: at the 3rd, after 7 buffered tokens):
    y and every state output (present_key, the buffers, the pooled rows, CSA's overlap and
    indexer state) equal the eager layer's at every call; the model fed its own outputs.
    every query compared: CSA with 8 index heads has no top-k tie, with 2 some (``tied``)."""
    layer, x, keep = _layer_and_prompt(request, index, source)
    session = _session(layer)
    y_errors, state_errors, ties = _cached_errors(layer, session, _decode_chunks(x, keep))
    assert max(y_errors) <= TOLERANCE and max(state_errors) <= TOLERANCE, (
        y_errors, state_errors)
    assert (ties > 0) == tied, ties


def test_the_cached_models_io_names_and_shapes(request):
    """CSA's inputs and outputs by name and order, HCA's state keys; onnx's full check (strict
    shape inference) passes on both models."""
    import onnx
    for index in (HCA, CSA):
        layer = _layer_and_prompt(request, index)[0]
        onnx.checker.check_model(dsv4_model(layer.shape, layer.state_dict(), cached=True),
                                 full_check=True)
    session = _session(layer)  # CSA's
    keys = graph_state.state_keys(layer.shape.layer_type)
    assert [i.name for i in session.get_inputs()] == [
        "x", "attention_mask", "past_key", *("past_" + k for k in keys), "position_ids"]
    assert [o.name for o in session.get_outputs()] == [
        "y", "present_key", *("present_" + k for k in keys)]
    assert len(keys) == 10 and "indexer.overlap_gate" in keys
    assert graph_state.state_keys("heavily_compressed_attention") == (
        "compressor.buffer_kv", "compressor.buffer_gate", "compressor.compressed_kv")


@pytest.mark.parametrize("index", [CSA, HCA])
def test_one_cached_model_takes_other_batch_sizes(request, index):
    """Dynamic axes: batch 1 (an 11-token prompt, 3 steps) and batch 3 (a 3-token prompt
    shorter than a window, one row left-padded; a 6-token chunk, 4 steps) through one model."""
    layer = _layer_and_prompt(request, index)[0]
    session = _session(layer)
    torch.manual_seed(4)
    for batch, length, chunk, steps in ((1, 11, 2, 3), (3, 3, 6, 4)):
        keep = torch.ones(batch, length, dtype=torch.long)
        keep[-1, :1] = 0 if batch > 1 else 1
        chunks = _decode_chunks(torch.randn(batch, length, layer.shape.dim), keep, chunk,
                                steps)
        y_errors, state_errors, _ = _cached_errors(layer, session, chunks)
        assert max(y_errors + state_errors) <= TOLERANCE, (batch, y_errors, state_errors)


# --- planted faults in the cached call: each one's graph code patched while the model is built --

def _emptied(g, t: str) -> str:
    """t (B, P, w) -> its first 0 rows (B, 0, w): a state input not read."""
    zero = g.ints("fault_zero", [0])
    return Ops(g).Slice(t, zero, zero, g.ints("fault_axes1", [1]))


def _zeroed(g, t: str) -> str:
    """t with every value 0 (its shape kept)."""
    return Ops(g).Mul(t, g.const("fault_none", np.array(0.0)))


def _buffer_dropped(cache: str, how):
    """The past buffer of a compressor (node names starting with ``cache``) through ``how``
    (_emptied: not read; _zeroed: its values lost)."""
    def plant(monkeypatch):
        windows = graph_compressed.complete_windows

        def dropped(g, kv, gate, rate, past, present, name):
            if name.startswith(cache):
                past = {**past, **{k: how(g, past[k]) for k in ("buffer_kv", "buffer_gate")}}
            return windows(g, kv, gate, rate, past, present, name)
        monkeypatch.setattr(graph_compressed, "complete_windows", dropped)
    return plant


def _index_past_rows_zeroed(monkeypatch):  # the top-k over this call's rows only, in effect
    rows = graph_compressed.compressed_rows

    def zeroed(g, s, w, x, prefix, width, overlap, past=None):
        if prefix.startswith("compressor.indexer") and past is not None:
            past = {**past, "compressed_kv": _zeroed(g, past["compressed_kv"])}
        return rows(g, s, w, x, prefix, width, overlap, past)
    monkeypatch.setattr(graph_compressed, "compressed_rows", zeroed)


def _overlap_state_dropped(monkeypatch):
    prior = graph_compressed.prior_window
    monkeypatch.setattr(graph_compressed, "prior_window", lambda g, overlap, *args: prior(
        g, _emptied(g, overlap), *args))


def _overlap_state_kept(monkeypatch):  # the present overlap: the past's, never updated
    monkeypatch.setattr(graph_compressed, "last_firsts", lambda g, overlap, *args: overlap)


def _pooled_row_closing_late(monkeypatch):
    closed = graph_compressed.closed_by
    monkeypatch.setattr(graph_compressed, "closed_by", lambda g, positions, rows, rate: closed(
        g, Ops(g).Sub(positions, g.ints("late", 1)), rows, rate))


def _rows_rotated_from_zero(monkeypatch):  # this call's rows rotated as if none were past
    starts = graph_compressed.window_starts
    monkeypatch.setattr(graph_compressed, "window_starts", lambda g, windows, rate, past_rows:
                        starts(g, windows, rate, None))


CACHED_FAULTS = {"buffer not carried": (_buffer_dropped("compressor", _emptied), HCA),
                 "indexer's buffer zeroed": (_buffer_dropped("compressor_indexer", _zeroed),
                                             CSA),
                 "indexer's past rows zeroed": (_index_past_rows_zeroed, CSA),
                 "overlap state dropped": (_overlap_state_dropped, CSA),
                 "overlap state never updated": (_overlap_state_kept, CSA),
                 "a pooled row closing one token late": (_pooled_row_closing_late, HCA),
                 "new rows rotated from position 0": (_rows_rotated_from_zero, HCA)}


@pytest.mark.parametrize("fault", CACHED_FAULTS)
def test_a_planted_fault_in_the_cached_call_fails(request, fault, monkeypatch):
    """The cached test's calls: the fault's y differs from eager's in a call after the
    prompt (one with a past state)."""
    plant, index = CACHED_FAULTS[fault]
    layer, x, keep = _layer_and_prompt(request, index)
    with monkeypatch.context() as patch:
        plant(patch)
        session = _session(layer)
    y_errors = _cached_errors(layer, session, _decode_chunks(x, keep))[0]
    assert max(y_errors[1:]) > 1e-3, y_errors
