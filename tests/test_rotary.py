"""The yarn (gpt-oss) and longrope (Phi-3) rope types against transformers' own math: the tables
and attention factors of ROPE_INIT_FUNCTIONS, cos/sin of the models' rotary embedding modules
(longrope on both sides of its switch), the settings' checks, and the ONNX graph and TorchScript
against the eager module — with planted faults (longrope stuck on its short table, yarn without
its attention factor) that must show.

transformers is a test-only dependency: tiny configs are built here, nothing is downloaded.
"""
from __future__ import annotations

import json
import math
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mha_export import MHAConfig, UsageError, export_onnx, load_module
from mha_export.layer.rotary import cos_sin, inv_freq, rope_tables
from mha_export.rope_types import SCALINGS, normalized_scaling

TINY = dict(hidden_size=64, num_hidden_layers=2, vocab_size=101)
# gpt-oss: head_dim 16; transformers' default rope_parameters (yarn, factor 32, theta 150000,
# original 4096, beta 32 / 1, truncate False) unless a test passes its own.
GPT_OSS = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32,
               num_local_experts=2, num_experts_per_tok=1, **TINY)
ORIGINAL, MAX_POS = 64, 256  # Phi-3 style longrope: switch after 64 positions


def _factors(seed: int, n: int = 8) -> list[float]:
    """n float64 numbers in [1, 4] (not float32-exact: both sides must round them alike)."""
    rng = random.Random(seed)
    return [rng.uniform(1.0, 4.0) for _ in range(n)]


LONGROPE = {"rope_type": "longrope", "short_factor": _factors(1), "long_factor": _factors(2)}


def _gpt_oss(rope: dict | None = None):
    kw = {} if rope is None else {"rope_parameters": {"rope_theta": 150000.0, **rope}}
    return AutoConfig.for_model("gpt_oss", **GPT_OSS, **kw)


def _phi3(rope: dict):
    return AutoConfig.for_model("phi3", num_attention_heads=4, pad_token_id=None,
                                eos_token_id=None, bos_token_id=None, rope_scaling=dict(rope),
                                max_position_embeddings=MAX_POS,
                                original_max_position_embeddings=ORIGINAL, **TINY)


def _ours(cfg) -> tuple[int, float, dict]:
    """(rotary_dim, theta, our scaling dict) from a transformers config, as the checkpoint reader
    must write it: factor put in where transformers derives it from max_position_embeddings."""
    params = dict(cfg.rope_parameters)
    theta = params.pop("rope_theta")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rd = int(head_dim * params.pop("partial_rotary_factor", 1.0))
    if params.get("factor") is None:
        params["factor"] = cfg.max_position_embeddings / params["original_max_position_embeddings"]
    return rd, theta, params


YARNS = {
    "gpt-oss": None,  # the config's own defaults
    "truncated-mscale": {"rope_type": "yarn", "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 512},
    "attention-factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25,
                         "truncate": False},
    "partial": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 128,
                "partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("name", YARNS)
def test_yarn_tables_and_attention_factor_equal_transformers(name):
    cfg = _gpt_oss(YARNS[name])
    want, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    rd, theta, scaling = _ours(cfg)
    tables = rope_tables(rd, theta, scaling)
    assert torch.equal(tables.inv_freq, want) and tables.inv_freq.dtype == torch.float32
    assert tables.attention_factor == factor and tables.long_inv_freq is None
    assert torch.equal(inv_freq(rd, theta, scaling), want)
    if name == "gpt-oss":
        assert (theta, scaling["factor"], scaling["original_max_position_embeddings"],
                scaling["beta_fast"], scaling["beta_slow"], scaling["truncate"]) == (
                    150000.0, 32.0, 4096, 32.0, 1.0, False)
        assert factor > 1.3  # 0.1 ln 32 + 1: the factor is there to be lost


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["gpt-oss", "attention-factor"])
def test_yarn_cos_sin_equal_the_gpt_oss_rotary_module(name, dtype):
    cfg = _gpt_oss(YARNS[name])
    rotary_emb = AutoModelForCausalLM.from_config(cfg).model.rotary_emb
    tables = rope_tables(*_ours(cfg))
    pos = torch.tensor([[0, 1, 2, 4095, 4096, 4097], [7, 100, 5000, 30000, 70000, 131071]])
    want_cos, want_sin = rotary_emb(torch.zeros(2, 6, 64, dtype=dtype), pos)  # (B, T, rd/2)
    cos, sin = cos_sin(pos, tables.inv_freq, dtype, attention_factor=tables.attention_factor)
    assert torch.equal(cos.squeeze(1), want_cos) and torch.equal(sin.squeeze(1), want_sin)
    dropped, _ = cos_sin(pos, tables.inv_freq, torch.float32)  # planted: no attention factor
    assert (dropped.squeeze(1) - want_cos.float()).abs().max() > 1e-4


@pytest.mark.parametrize("extra", [{}, {"factor": 2.0}, {"attention_factor": 1.5}])
def test_longrope_tables_and_attention_factor_equal_transformers(extra):
    cfg = _phi3({**LONGROPE, **extra})
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](cfg)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, seq_len=ORIGINAL + 1)
    rd, theta, scaling = _ours(cfg)
    assert rd == 16 and len(scaling["short_factor"]) == 8
    tables = rope_tables(rd, theta, scaling)
    assert torch.equal(tables.inv_freq, short) and torch.equal(tables.long_inv_freq, long)
    assert tables.switch_len == ORIGINAL and tables.attention_factor == factor
    if not extra:  # factor derived from max_position_embeddings / original: 4
        assert scaling["factor"] == 4.0 and factor == math.sqrt(1 + math.log(4) / math.log(64))


def _longrope_positions(top: int) -> torch.Tensor:
    """(2, 5): only row 1 reaches position top - 1; the whole call switches on it."""
    return torch.stack([torch.arange(5), torch.arange(top - 5, top)])


@pytest.mark.parametrize("top", [ORIGINAL, ORIGINAL + 1, MAX_POS + 3])
def test_longrope_cos_sin_equal_the_phi3_rotary_module_on_both_sides_of_the_switch(top):
    cfg = _phi3(LONGROPE)
    rotary_emb = AutoModelForCausalLM.from_config(cfg).model.rotary_emb
    tables = rope_tables(*_ours(cfg))
    pos = _longrope_positions(top)
    args = (tables.long_inv_freq, tables.switch_len, tables.attention_factor)
    for dtype in (torch.float32, torch.float16):
        want_cos, want_sin = rotary_emb(torch.zeros(2, 5, 64, dtype=dtype), pos)  # (B, T, rd)
        cos, sin = cos_sin(pos, tables.inv_freq, dtype, *args)  # (B, 1, T, rd/2)
        assert torch.equal(torch.cat([cos, cos], -1).squeeze(1), want_cos)
        assert torch.equal(torch.cat([sin, sin], -1).squeeze(1), want_sin)
    # planted: stuck on the short table (long table = short table)
    want_cos, _ = rotary_emb(torch.zeros(2, 5, 64), pos)
    stuck, _ = cos_sin(pos, tables.inv_freq, torch.float32, tables.inv_freq,
                       tables.switch_len, tables.attention_factor)
    gap = (torch.cat([stuck, stuck], -1).squeeze(1) - want_cos).abs().max()
    assert gap > 1e-4 if top > ORIGINAL else gap == 0


def test_cos_sin_scripts_and_an_empty_long_table_means_none():
    scripted = torch.jit.script(cos_sin)
    tables = rope_tables(16, 10000.0, {**LONGROPE, "original_max_position_embeddings": ORIGINAL,
                                       "factor": 4.0})
    for top in (ORIGINAL, ORIGINAL + 1):
        pos = _longrope_positions(top)
        args = (pos, tables.inv_freq, torch.float32, tables.long_inv_freq, tables.switch_len,
                tables.attention_factor)
        assert all(torch.equal(a, b) for a, b in zip(scripted(*args), cos_sin(*args)))
    pos = _longrope_positions(ORIGINAL + 1)
    plain = cos_sin(pos, tables.inv_freq, torch.float32)
    for empty in (torch.zeros(0), None):
        assert all(torch.equal(a, b) for a, b in zip(
            scripted(pos, tables.inv_freq, torch.float32, empty, ORIGINAL, 1.0), plain))


# --- the settings -------------------------------------------------------------------------------

def test_normalized_yarn_and_longrope_are_complete_idempotent_and_json_safe():
    yarn = normalized_scaling({"type": "yarn", "factor": 32, "beta_fast": None, "mscale": None,
                               "original_max_position_embeddings": 4096.0})
    assert yarn == {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 4096,
                    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    assert normalized_scaling({**yarn, "truncate": None})["truncate"] is False  # as `if None`
    assert normalized_scaling({**yarn, "beta_slow": 0})["beta_slow"] == 1.0  # as `0 or 1`
    longrope = normalized_scaling({**LONGROPE, "original_max_position_embeddings": 64,
                                   "factor": 32}, rotary_dim=16)
    for s in (yarn, longrope):
        assert normalized_scaling(s, 16) == s == json.loads(json.dumps(s))
    assert {"yarn", "longrope", "llama3"} <= set(SCALINGS)


LONG = {**LONGROPE, "original_max_position_embeddings": 64, "factor": 4.0}
BAD = [
    ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "factor"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64.5},
     "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "beta_fast": -1}, "beta_fast"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "attention_factor": float("nan")}, "attention_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "truncate": "yes"}, "truncate"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
      "mscale": -0.5}, "mscale"),
    ({**LONG, "short_factor": [1.0] * 7}, "short_factor of rotary_dim / 2 = 8"),
    ({**LONG, "long_factor": [1.0] * 7 + [0.0]}, "long_factor"),
    ({**LONG, "long_factor": "1, 2"}, "long_factor"),
    ({**LONG, "short_factor": None}, "short_factor"),
    ({k: v for k, v in LONG.items() if k != "factor"}, "factor"),
    ({**LONG, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({**LONG, "factor": True}, "factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, "unsupported rope scaling type 'dynamic'"),
]


@pytest.mark.parametrize("scaling, field", BAD, ids=lambda v: v if isinstance(v, str) else "")
def test_bad_settings_are_one_line_usage_errors_naming_the_field(scaling, field):
    with pytest.raises(UsageError) as info:
        normalized_scaling(scaling, rotary_dim=16)
    assert field in str(info.value) and "\n" not in str(info.value)


# --- the exported graph and TorchScript against the eager module ------------------------------

SCALED = {"longrope": LONG,
          "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}}


def _artifact(tmp_path, rope: dict, attention: str = "decomposed"):
    cfg = MHAConfig(dim=32, heads=2, rotary="half", rope_scaling=rope)
    folder = tmp_path / f"{rope['rope_type']}-{attention}"
    export_onnx(cfg, folder, attention=attention, validate=False)
    module = load_module(cfg, folder / "weights.safetensors")
    return onnx.load(str(folder / "model.onnx")), module


def _run(model, feeds: dict, reference: bool = False) -> np.ndarray:
    if reference:
        return ReferenceEvaluator(model).run(None, feeds)[0]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _eager(module, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return module.attend(torch.from_numpy(x), None, None, None,
                             torch.from_numpy(pos))[0].numpy()


def _plant(model, name: str, value: np.ndarray):
    """A copy of model with initializer ``name`` replaced."""
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    for t in bad.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(t).dtype), name))
            return bad
    raise AssertionError(f"no initializer {name}")


@pytest.mark.parametrize("attention", ["decomposed", "auto"])
def test_longrope_graph_equals_eager_on_both_sides_and_a_stuck_short_table_fails(tmp_path,
                                                                                  attention):
    model, module = _artifact(tmp_path, LONG, attention)
    assert model.opset_import[0].version == (17 if attention == "decomposed" else 23)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    stuck = _plant(model, "rotary.long_inv_freq", inits["rotary.inv_freq"])
    x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
    for top in (ORIGINAL, ORIGINAL + 1):
        pos = _longrope_positions(top).numpy()
        feeds, want = {"x": x, "position_ids": pos}, _eager(module, x, pos)
        runs = [_run(model, feeds)] + ([_run(model, feeds, True)] if attention == "decomposed"
                                       else [])
        assert all(np.abs(got - want).max() <= 1e-5 for got in runs), top
        gap = np.abs(_run(stuck, feeds) - want).max()
        assert gap > 1e-4 if top > ORIGINAL else gap <= 1e-5, (top, gap)


def test_yarn_graph_equals_eager_and_without_its_attention_factor_fails(tmp_path):
    model, module = _artifact(tmp_path, SCALED["yarn"])
    dropped = _plant(model, "rotary.attention_factor", np.array(1.0))
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    pos = _longrope_positions(40).numpy()
    feeds, want = {"x": x, "position_ids": pos}, _eager(module, x, pos)
    for got in (_run(model, feeds), _run(model, feeds, reference=True)):
        assert np.abs(got - want).max() <= 1e-5
    assert np.abs(_run(dropped, feeds) - want).max() > 1e-4


@pytest.mark.parametrize("kind", SCALED)
def test_torchscript_module_equals_eager_on_both_sides_of_the_switch(kind):
    from mha_export import build_module
    from mha_export.layer.entry import entry_module
    module = build_module(MHAConfig(dim=32, heads=2, rotary="half", rope_scaling=SCALED[kind]),
                          seed=0)
    scripted = torch.jit.script(entry_module(module, "full", ["x", "position_ids"], ["y"]))
    x = torch.randn(2, 5, 32)
    for top in (ORIGINAL, ORIGINAL + 1):
        pos = _longrope_positions(top)
        with torch.inference_mode():
            assert torch.equal(scripted(x, pos), module.attend(x, None, None, None, pos)[0])
