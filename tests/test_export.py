import json

import onnx
import pytest
import torch

from mha_export import MHAConfig, UsageError, export_onnx, export_torchscript
from mha_export.targets.onnx import export as export_mod
from mha_export.artifact import read_artifact
from mha_export.errors import StageFailed

CFG = MHAConfig(dim=64, heads=4, max_seq_len=32)


def test_onnx_artifact_is_self_describing(tmp_path):
    result = export_onnx(CFG, tmp_path / "a")
    assert result.passed
    files = sorted(p.name for p in result.path.iterdir())
    assert files == ["config.json", "model.onnx", "parity.json", "weights.safetensors"]
    meta = json.loads((result.path / "config.json").read_text())
    assert meta["config"] == CFG.to_dict()
    assert [(t["name"], t["dtype"], t["shape"]) for t in meta["io"]["inputs"]] == [
        ("x", "float", ["batch", "seq", 64])]
    assert [(t["name"], t["shape"]) for t in meta["io"]["outputs"]] == [("y", ["batch", "seq", 64])]
    assert meta["io"]["kind"] == "full" and meta["io"]["dynamic_axes"]["x"] == {"0": "batch", "1": "seq"}
    assert meta["export"]["opset"] == 23 and meta["export"]["attention"] == "auto"
    assert meta["export"]["external_data"] is False
    assert {"torch", "onnx", "python"} <= set(meta["versions"])
    model = onnx.load(str(result.path / "model.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["mha_export.config"]) == CFG.to_dict()
    assert json.loads(props["mha_export.io"]) == meta["io"]
    onnx.checker.check_model(model, full_check=True)
    assert json.loads((result.path / "parity.json").read_text())["passed"] is True


def test_torchscript_artifact_loads_and_is_dynamic(tmp_path):
    result = export_torchscript(CFG, tmp_path / "ts")
    assert result.passed
    ts = torch.jit.load(str(result.path / "model.pt"))
    module = read_artifact(result.path).load_source_module()
    for b, t in [(1, 1), (2, 5), (3, 32), (1, 50)]:
        x = torch.randn(b, t, 64)
        assert torch.equal(ts(x), module(x))


def test_default_folder_and_no_overwrite_without_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = export_onnx(heads=4, dim=64, max_seq_len=16, validate=False)
    assert str(first.path) == "models/split-h4-d64-onnx"
    with pytest.raises(UsageError, match="--force"):
        export_onnx(heads=4, dim=64, max_seq_len=16, validate=False, seed=1)
    export_onnx(heads=4, dim=64, max_seq_len=16, validate=False, seed=1, force=True)
    assert json.loads((first.path / "config.json").read_text())["weights"]["source"]["seed"] == 1
    assert [p.name for p in tmp_path.joinpath("models").iterdir()] == ["split-h4-d64-onnx"]


def test_exports_of_one_layer_in_each_dtype_land_apart(tmp_path, monkeypatch):
    """The README tour's --force on every line: an fp16 or bf16 export never replaces the
    fp32 one (float32 keeps its name: models/split-h4-d64-onnx, as the docs say)."""
    monkeypatch.chdir(tmp_path)
    for dtype, name in (("float32", "split-h4-d64-onnx"), ("float16", "split-h4-d64-fp16-onnx"),
                        ("bfloat16", "split-h4-d64-bf16-onnx")):
        path = export_onnx(heads=4, dim=64, max_seq_len=16, dtype=dtype, validate=False,
                           force=True).path
        assert str(path) == f"models/{name}"
    for name, dtype in (("split-h4-d64-onnx", "float32"),
                        ("split-h4-d64-bf16-onnx", "bfloat16")):
        meta = json.loads((tmp_path / "models" / name / "config.json").read_text())
        assert meta["export"]["dtype"] == dtype


@pytest.mark.parametrize("target, call, options, tag", [
    ("onnx", "full", dict(attention="decomposed", opset=20), ""),  # the same function
    ("onnx", "static-cache", dict(dtype="float16"), "-fp16"),
    ("executorch", "full", dict(backend="xnnpack", max_batch=4, kernels="aten"), ""),
    ("executorch", "static-cache", dict(max_batch=1), ""),
    ("executorch", "full", dict(backend="portable"), "-portable"),
    ("executorch", "full", dict(max_batch=8), "-b8"),
    ("executorch", "static-cache", dict(max_batch=3, kernels="llm"), "-b3-llm"),
    ("aoti", "full", dict(device="cpu"), ""),
    ("aoti", "full", dict(device="cuda"), "-cuda"),
    ("torchscript", "full", {}, ""),
])
def test_default_folder_names_each_target_option_away_from_its_default(target, call, options,
                                                                       tag):
    from mha_export.targets.registry import TARGETS
    from mha_export.signature import make_signature
    assert TARGETS[target].folder_tag(CFG, make_signature(CFG, call), **options) == tag


def test_an_executorch_export_without_o_names_its_options_folder(tmp_path, monkeypatch):
    """The tag reaches the export's folder (refused before lowering: that folder is taken)."""
    from click.testing import CliRunner
    from mha_export.cli.commands import cli
    monkeypatch.chdir(tmp_path)
    taken = tmp_path / "models" / "split-h4-d64-portable-b2-executorch"
    taken.mkdir(parents=True)
    (taken / "config.json").write_text('{"config": {}, "export": {"file": "model.pte"}}')
    r = CliRunner().invoke(cli, ["executorch", "--heads", "4", "--dim", "64",
                                 "--max-seq-len", "16", "--backend", "portable",
                                 "--max-batch", "2"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"{taken.relative_to(tmp_path)} already holds" in r.stderr, r.stderr


def test_existing_empty_folder_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    export_onnx(CFG, tmp_path / "empty", validate=False)
    assert (tmp_path / "empty" / "model.onnx").is_file()


def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(export_mod.onnx, "save_model", broken)
    with pytest.raises(StageFailed, match="writing model.onnx failed: RuntimeError: disk full"
                       ) as failed:  # one line naming the stage, the library's error its cause
        export_onnx(CFG, tmp_path / "out", validate=False)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_failed_forced_export_keeps_the_old_artifact(tmp_path, monkeypatch):
    export_onnx(CFG, tmp_path / "out", validate=False)
    before = (tmp_path / "out" / "model.onnx").read_bytes()
    monkeypatch.setattr(export_mod.onnx, "save_model", lambda *a, **k: 1 / 0)
    with pytest.raises(StageFailed, match="ZeroDivisionError"):
        export_onnx(CFG, tmp_path / "out", validate=False, force=True, seed=5)
    assert (tmp_path / "out" / "model.onnx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_external_data_beyond_protobuf_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(export_mod, "PROTOBUF_LIMIT", 1000)  # pretend the model is > 2 GB
    result = export_onnx(CFG, tmp_path / "big")
    assert (result.path / "model.onnx.data").is_file() and result.passed
    assert json.loads((result.path / "config.json").read_text())["export"]["external_data"] is True


BAD_SETTINGS = [
    (dict(opset=22), "opset 22 cannot be produced"),
    (dict(attention="decomposed", opset=16), "opset 16 cannot be produced"),
    (dict(opset=27), "opset 27 cannot be produced"),
    (dict(attention="attention-op", opset=22), "supported: 23-"),
    (dict(attention="flash"), "unknown attention form"),
    (dict(layer=2), "--layer needs --weights"),
]


@pytest.mark.parametrize("kw, msg", BAD_SETTINGS)
def test_bad_export_settings(tmp_path, kw, msg):
    with pytest.raises(UsageError, match=msg):
        export_onnx(CFG, tmp_path / "x", validate=False, **kw)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kw, msg", BAD_SETTINGS)
def test_the_request_checks_refuse_them_with_nothing_built(monkeypatch, kw, msg):
    """The export's request checks (a fan-out's preflight) refuse what the export refuses,
    building nothing; a good request passes them, still building nothing."""
    from mha_export.export.pipeline import checked_export

    def built(*args, **kwargs):
        raise AssertionError("the graph was built")

    monkeypatch.setattr(export_mod, "build_model", built)
    with pytest.raises(UsageError, match=msg):
        checked_export("onnx", config=CFG, **kw)
    asked = checked_export("onnx", config=CFG, attention="decomposed", opset=17, kv_cache=True)
    assert asked.kind == "kv-cache" and asked.options == {"attention": "decomposed", "opset": 17}


def test_layout_defaults_to_the_weights_layout(tmp_path):
    from mha_export import build_module
    from mha_export.weights.files import save_weights
    save_weights(build_module(MHAConfig(dim=64, heads=4, layout="fused"), seed=0), tmp_path / "w.safetensors")
    r = export_onnx(heads=4, dim=64, max_seq_len=16, weights=tmp_path / "w.safetensors", output=tmp_path / "o")
    assert read_artifact(r.path).config.layout == "fused" and r.passed


@pytest.mark.parametrize("kind", ["kv-cache", "attention-mask"])
def test_decode_artifacts_declare_their_named_io(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    flags = {"kv_cache": True} if kind == "kv-cache" else {"attention_mask": True}
    onnx_art = export_onnx(heads=4, dim=64, max_seq_len=16, **flags)
    ts_art = export_torchscript(heads=4, dim=64, max_seq_len=16, **flags)
    assert onnx_art.passed and ts_art.passed
    suffix = "-kv" if kind == "kv-cache" else "-masked"
    assert str(onnx_art.path) == f"models/split-h4-d64{suffix}-onnx"
    sig = read_artifact(onnx_art.path).signature
    model = onnx.load(str(onnx_art.path / "model.onnx"))
    assert [i.name for i in model.graph.input] == sig.input_names
    assert [o.name for o in model.graph.output] == sig.output_names
    ts = torch.jit.load(str(ts_art.path / "model.pt"))
    assert list(ts.input_names) == sig.input_names and list(ts.output_names) == sig.output_names
    if kind == "kv-cache":
        assert sig.input_names == ["x", "attention_mask", "past_key", "past_value"]
        assert sig.output_names == ["y", "present_key", "present_value"]
        past = [t for t in sig.inputs if t.name == "past_key"][0]
        assert past.shape == ("batch", 4, "past_seq", 16)


def test_a_form_without_the_cache_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="forms that can: auto"):
        export_onnx(CFG, tmp_path / "x", attention="contrib-mha", kv_cache=True)
    assert not (tmp_path / "x").exists()


def test_spellings_renamed_in_0_2_are_gone_in_0_3(tmp_path):
    """check= (now validate=) is an unknown option, mha_export.check the check subpackage."""
    import mha_export as mx
    import mha_export.check
    with pytest.raises(UsageError, match="unknown fields: check"):
        export_onnx(output=tmp_path / "a", check=False)
    assert not (tmp_path / "a").exists()
    assert mx.check is mha_export.check and callable(mx.check_parity)


def test_torchscript_export_passes_on_torchs_deprecation_once(tmp_path, recwarn):
    """torch 2.13 deprecates torch.jit: the export says so (once), with where to go instead."""
    export_torchscript(CFG, tmp_path / "ts", validate=False)
    jit = [w for w in recwarn if issubclass(w.category, DeprecationWarning)
           and "torch.jit.script" in str(w.message)]
    assert len(jit) == 1 and "mha-export aoti" in str(jit[0].message)
