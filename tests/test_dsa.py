"""DeepSeek Sparse Attention (kinds/dsa/: the lightning indexer on MLA). Against transformers'
own modules: tests/test_checkpoints.py (deepseek_v32, glm_moe_dsa: a left-padded batch, full
and cached, the latent, rotated-key and indexer caches). Here: the selection acts, equal scores
keep the earlier keys in every runtime, the check's sweep crosses index_topk, planted faults in
the indexer fail the check, and what cannot be built is one line. GLM-5's shared-top-k layers:
tests/test_glm5_shared.py."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from click.testing import CliRunner

import faults
from mha_export import check_parity, export_onnx
from mha_export.check.sweep import window_cases
from mha_export.cli.commands import cli
from mha_export.config import MHAConfig
from mha_export.errors import UsageError
from mha_export.kinds.registry import build_module
from mha_export.signature import make_signature

LATENT = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
              q_lora_rank=48)
INDEX = dict(topk=4, heads=8, head_dim=16)
SWEEP = dict(seq_lens=[1, 3, 9], past_lens=[0, 6], batch_sizes=[1, 2], providers=["cpu"])


def _config(**index) -> MHAConfig:
    return MHAConfig(dim=64, heads=4, max_seq_len=16, latent=dict(LATENT,
                                                                   index={**INDEX, **index}))


def test_the_selection_acts_past_index_topk_only():
    sparse = build_module(_config(), seed=0)
    dense = build_module(MHAConfig(dim=64, heads=4, max_seq_len=16, latent=LATENT))
    state = {k: v for k, v in sparse.state_dict().items() if not k.startswith("indexer.")}
    dense.load_state_dict(state)
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ys, yd = sparse.attend(x, None, None, None)[0], dense.attend(x, None, None, None)[0]
    # queries 0-3 see at most 4 keys: all kept; later ones drop keys
    torch.testing.assert_close(ys[:, :4], yd[:, :4], rtol=1e-4, atol=1e-5)
    assert (ys[:, 4:] - yd[:, 4:]).abs().amax(dim=-1).min() > 1e-4


def test_equal_scores_keep_the_earlier_keys_in_every_runtime(tmp_path):
    """Head weights of 0: every visible key scores 0, so each query keeps its first 4; ONNX
    Runtime's TopK and the eager layer agree (torch.topk alone leaves ties unspecified)."""
    module = build_module(_config(), seed=0)
    with torch.no_grad():
        module.indexer.weights_proj.weight.zero_()
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        y = module.attend(x, None, None, None)[0]
        first = module.attend(x[:, :4], None, None, None)[0]  # the first 4 keys alone
    torch.testing.assert_close(y[:, :4], first)
    torch.save(module.state_dict(), tmp_path / "w.pt")
    path = export_onnx(weights=str(tmp_path / "w.pt"), output=tmp_path / "a", validate=False,
                       kv_cache=True, **_fields()).path
    assert check_parity(path, **SWEEP).passed


def _fields() -> dict:
    c = _config()
    return dict(dim=64, heads=4, max_seq_len=16, latent=c.to_dict()["latent"])


def test_the_check_crosses_index_topk():
    c = MHAConfig(dim=64, heads=4, max_seq_len=16, latent=dict(LATENT, index={"topk": 2048}))
    assert c.reach == 2048
    full, cached = (make_signature(c, k) for k in ("full", "kv-cache"))
    assert [k.seq for k in window_cases(c, full, [1, 16], lambda t: True)] == [2049]
    assert [(k.seq, k.past) for k in window_cases(c, cached, [1, 16], lambda t: True)] == [
        (2, 2048)]


DSA_FAULTS = {
    "top-k one short": lambda p: faults.rope_initializer_set(p, "index_topk", INDEX["topk"] - 1),
    "index scores negated (the bottom k kept)": lambda p: faults.rope_initializer_set(
        p, "index_weight_scale", -(INDEX["heads"] ** -0.5)),
    "the selection never acts": lambda p: faults.rope_initializer_set(p, "index_topk", 10**6),
}


@pytest.mark.parametrize("fault", sorted(DSA_FAULTS))
@pytest.mark.parametrize("call", ["full", "static-cache"])
def test_planted_indexer_fault_is_caught(tmp_path, fault, call):
    path = export_onnx(_config(), tmp_path / "a", validate=False,
                       static_cache=call == "static-cache").path
    assert check_parity(path, **SWEEP).passed
    DSA_FAULTS[fault](path / "model.onnx")
    assert not check_parity(path, **SWEEP).passed


SELECTION_FAULTS = {"each position one later": faults.selection_shifted,
                    "the (k+1)-th key kept for the k-th": lambda p: faults.selection_kth_pick_wrong(
                        p, INDEX["topk"])}


@pytest.mark.parametrize("fault", sorted(SELECTION_FAULTS))
@pytest.mark.parametrize("call", ["full", "masked", "kv-cache", "static-cache"])
def test_a_feeding_layers_selection_is_checked_and_a_planted_fault_caught(tmp_path, fault,
                                                                          call):
    """A layer whose selection shared layers read (index feeds) outputs topk_indices in every
    call; the check compares it (as sets per real query) and fails a planted fault that leaves
    y as it was."""
    c = MHAConfig(dim=64, heads=4, max_seq_len=16,
                  latent=dict(LATENT, index=dict(INDEX, feeds=True)))
    path = export_onnx(c, tmp_path / "a", validate=False, attention_mask=call == "masked",
                       kv_cache=call == "kv-cache", static_cache=call == "static-cache").path
    report = check_parity(path, **SWEEP)
    assert report.passed and "topk_indices" in {r.output for r in report.results}
    SELECTION_FAULTS[fault](path / "model.onnx")
    report = check_parity(path, **SWEEP)
    assert not report.passed
    assert {r.output for r in report.results if not r.passed} == {"topk_indices"}


@pytest.mark.parametrize("call", ["full", "static-cache"])
def test_a_feeding_layers_torchscript_calls_pass_their_check(tmp_path, call):
    from mha_export import export_torchscript
    c = MHAConfig(dim=64, heads=4, max_seq_len=16,
                  latent=dict(LATENT, index=dict(INDEX, feeds=True)))
    path = export_torchscript(c, tmp_path / "a", validate=False,
                              static_cache=call == "static-cache").path
    report = check_parity(path, **SWEEP)
    assert report.passed and "topk_indices" in {r.output for r in report.results}


@pytest.mark.parametrize("change, msg", [
    (dict(q_lora_rank=None), "it needs q_lora_rank"),
    (dict(index={"topk": 0}), "index topk must be a positive integer"),
    (dict(index={"topk": 4, "head_dim": 4}), "narrower than qk_rope_head_dim"),
    (dict(index={"topk": 4, "rope": "pairs"}), "unknown index rope"),
])
def test_bad_indexer_settings_are_one_line(change, msg):
    with pytest.raises(UsageError, match=msg):
        MHAConfig(dim=64, heads=4, latent={**LATENT, **change, **(
            {} if "index" in change else {"index": INDEX})})


@pytest.mark.parametrize("args, msg", [
    (["--index-topk", "4"], "--index-topk needs --kv-lora-rank (Multi-head Latent Attention)"),
    (["--kv-lora-rank", "32", "--index-heads", "4"], "--index-heads needs --index-topk"),
])
def test_cli_refusals(tmp_path, args, msg):
    r = CliRunner().invoke(cli, ["onnx", "--heads", "4", "--dim", "64", *args, "-o",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.splitlines() == [f"Error: {msg}"], r.stderr
    assert not (tmp_path / "x").exists()
