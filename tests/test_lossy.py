"""The lossy steps' registries (lossy/registry.py, lossy/costs.py): what the stages ask of them."""
from __future__ import annotations

import pytest

from mha_export import MHAConfig, UsageError
from mha_export.check.parity import CheckReport
from mha_export.lossy import costs, registry
from mha_export.lossy.projections.rtn import QuantSpec
from mha_export.lossy.projections.source import SourceQuantSpec
from mha_export.weights.source import load_source
from mha_export.targets.registry import TARGETS


def test_every_step_and_cost_is_registered_once_with_its_own_field():
    assert [s.name for s in registry.STEPS] == ["half-weights", "quantize", "int8-cache"]
    assert [c.field for c in costs.COSTS] == ["quantization", "kv_cache", "half_weights"]
    assert set(costs.BUDGETS) == {"max_quant_error", "max_kv_error", "max_clip_rate",
                                  "max_rounding_error"}
    assert registry.api_keys() == ("quantize", "kv_cache_dtype", "calibration", "value_scale")


def test_an_empty_report_field_is_never_shared():
    one, two = CheckReport("a", 0, [1], [1]), CheckReport("b", 0, [1], [1])
    one.costs["quantization"].append("x")
    assert two.costs["quantization"] == [] and two.costs["real_quantization"] == []


def test_parity_json_keeps_0_3s_key_order():
    keys = list(CheckReport("a", 0, [1], [1]).to_dict())
    assert keys[keys.index("export_versions"):] == [
        "export_versions", "quantization", "kv_cache", "half_weights", "real_inputs",
        "real_quantization", "real_kv_cache", "real_half_weights", "passed", "picked",
        "runnable_here", "verdict"]  # 0.7's keys after 0.3's


def test_requests_are_refused_before_any_work():
    asked = {"quantize": QuantSpec(bits=4), "kv_cache_dtype": "int8"}
    with pytest.raises(UsageError, match="ONNX-only"):
        registry.requested(dict(asked), TARGETS["torchscript"], "static-cache", "float32")
    with pytest.raises(UsageError, match="needs --static-cache"):
        registry.requested(dict(asked), TARGETS["onnx"], "kv-cache", "float32")
    kw = {**asked, "heads": 4}
    wanted = registry.requested(kw, TARGETS["onnx"], "static-cache", "float32")
    assert set(wanted) == {"quantize", "int8-cache"} and kw == {"heads": 4}  # popped


def test_a_step_its_kind_does_not_build_is_refused_before_the_others_prepare():
    mla = MHAConfig(dim=64, heads=4, latent={"kv_lora_rank": 32, "qk_nope_head_dim": 8,
                                             "qk_rope_head_dim": 8, "v_head_dim": 8})
    source = load_source(mla, None, None, 0, {})
    wanted = registry.requested({"quantize": SourceQuantSpec(), "kv_cache_dtype": "int8"},
                                TARGETS["onnx"], "static-cache",
                                "float32")  # source would refuse first
    with pytest.raises(UsageError, match="not built for Multi-head Latent Attention"):
        registry.prepared(source, wanted, 0, "float32")


def test_attribution_runs_each_step_alone_then_together():
    spec = QuantSpec(bits=4, accuracy_level=4)
    runs = registry.attribution({"quantize": spec, "static_cache": True,
                                 "kv_cache_dtype": "int8"}, "ort-cpu")
    assert runs[0] == ("fp32 export", {"static_cache": True})
    assert runs[-1][0] == "all together"
    with pytest.raises(UsageError, match="ort-cpu"):
        registry.attribution({"quantize": spec}, "openvino-cpu")
