"""Multi-head Latent Attention from GGUF files (llama.cpp's ``deepseek2`` and ``glm-dsa``):
tiny DeepSeek-V3 and GLM-5 models written the way llama.cpp's convert_hf_to_gguf.py writes them
(DeepseekV2Model: MLA as multi-query attention over the latent, kv_b_proj split per head into a
transposed k_b and v_b, yarn's mscale_all_dim as 0.1 x yarn_log_multiplier; GlmMoeDsaModel: the
indexer's settings, its tensors on "full" layers only). Each layer read from the file has the
fields and the weights of the same layer read from the Hugging Face folder (which
tests/test_checkpoints.py and tests/test_glm5_shared.py prove against transformers); a layer's
output equals transformers' attention module's; a GLM-5 file's shared layers name their source.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from test_gguf import _calls, _close, _ids, _ours  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from mha_export.artifact import read_artifact  # noqa: E402
from mha_export.cli.commands import cli  # noqa: E402
from mha_export.errors import UsageError  # noqa: E402
from mha_export.weights.source import load_source  # noqa: E402

MLA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
           intermediate_size=32, vocab_size=60, max_position_embeddings=64, initializer_range=0.2,
           kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24,
           n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           moe_intermediate_size=16, first_k_dense_replace=1)
# llama.cpp keeps mscale_all_dim only (as yarn_log_multiplier): transformers' mscale equal to it
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.8,
        "mscale_all_dim": 0.8, "original_max_position_embeddings": 16}
GLM5_KINDS = ["full", "shared", "full", "shared"]
MODELS = {
    "deepseek2": ("deepseek_v3", dict(MLA, q_lora_rank=48, rope_interleave=True,
                                      rope_parameters=YARN)),
    "deepseek2-no-q-lora": ("deepseek_v3", dict(MLA, q_lora_rank=None, rope_interleave=True)),
    "glm-dsa": ("glm_moe_dsa", dict(MLA, num_hidden_layers=4, q_lora_rank=48, index_topk=4,
                                    index_n_heads=8, index_head_dim=16,
                                    indexer_types=GLM5_KINDS)),
}


def _metadata(w, cfg, rope: dict) -> None:
    """TextModel's keys with DeepseekV2Model's num_key_value_heads 1, then its own (and
    GlmMoeDsaModel's indexer keys)."""
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if cfg.q_lora_rank is not None:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    if cfg.model_type == "glm_moe_dsa":
        w.add_indexer_head_count(cfg.index_n_heads)
        w.add_indexer_key_length(cfg.index_head_dim)
        w.add_indexer_top_k(cfg.index_topk)


def _converted(model):
    """DeepseekV2Model.modify_tensors: kv_b_proj per head into k_b (transposed) and v_b."""
    cfg = model.config
    for name, t in model.state_dict().items():
        if not name.endswith("kv_b_proj.weight"):
            yield name, t
            continue
        nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
        k_b, v_b = t.view(cfg.num_attention_heads, nope + v, -1).split([nope, v], dim=1)
        yield name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2)  # (N, R, Hn)
        yield name.replace("kv_b_proj", "v_b_proj"), v_b  # (N, Hv, R)


def _write(path, model, arch: str):
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, cfg, dict(cfg.rope_parameters or {}))
    w.add_vocab_size(cfg.vocab_size)
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), cfg.num_hidden_layers)
    for name, t in _converted(model):
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is not None and ".self_attn." in name:  # the attention's tensors suffice here
            w.add_tensor(new, t.float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (model, its GGUF file, its Hugging Face folder)."""
    out = {}
    for name, (kind, config) in MODELS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **config),
                                                 attn_implementation="eager").eval()
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():  # norms and biases away from their initial ones and zeros
            for key, p in model.named_parameters():
                if ".self_attn." in key and ("norm" in key or key.endswith(".bias")):
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder / "hf")
        arch = name.split("-no-")[0]
        out[name] = model, _write(folder / f"{name}.gguf", model, arch), folder / "hf"
    return out


@pytest.mark.parametrize("name, layer", [("deepseek2", 1), ("deepseek2-no-q-lora", 0),
                                         ("glm-dsa", 0), ("glm-dsa", 1), ("glm-dsa", 3)])
def test_a_gguf_layer_is_the_hugging_face_layer(files, name, layer):
    _, path, folder = files[name]
    ours, theirs = (load_source(weights=w, layer=layer) for w in (path, folder))
    assert ours.config == theirs.config
    want = theirs.module.state_dict()
    got = ours.module.state_dict()
    assert got.keys() == want.keys()
    for key, t in want.items():
        assert torch.equal(got[key], t), key


def test_a_deepseek2_layer_equals_transformers_attention(files):
    model, path, _ = files["deepseek2"]
    (x, want), = [_calls(model, (1,), _ids(model.config.vocab_size))[1]]
    _close(_ours(path, 1, x), want, "deepseek2@1")


def test_the_files_rope_and_shared_layers_are_read(files):
    config = load_source(weights=files["deepseek2"][1], layer=1).config
    assert config.rope_scaling["mscale"] == config.rope_scaling["mscale_all_dim"] == \
        pytest.approx(0.8)
    sources = [load_source(weights=files["glm-dsa"][1], layer=i).config.latent.index.source
               for i in range(4)]
    assert sources == [None, 0, None, 2]


def test_a_file_without_the_latent_keys_is_a_usage_error(files, tmp_path):
    reader = gguf.GGUFReader(files["deepseek2"][1])
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "deepseek2")
    for field in reader.fields.values():
        if field.name.startswith("deepseek2.") and "kv_lora_rank" not in field.name:
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY
                            else None)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed(
            [int(n) for n in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UsageError, match="kv_lora_rank"):
        load_source(weights=tmp_path / "bad.gguf", layer=1)


def test_a_glm5_files_shared_layer_exports_and_passes_its_check(files, tmp_path):
    out = tmp_path / "shared"
    r = CliRunner().invoke(cli, ["onnx", "--weights", str(files["glm-dsa"][1]), "--layer", "3",
                                 "--kv-cache", "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output
    assert "topk_indices" in read_artifact(out).signature.input_names
