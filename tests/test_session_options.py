"""The config entries a file asks of the app that runs it (mha_export/lossy/projections/session_options.py)."""
import json

import onnx
import pytest
from onnx import TensorProto, helper

from mha_export import MHAConfig, UsageError, export_onnx
from mha_export.lossy.projections import session_options as so


def _graph_with(initializer_type: int) -> onnx.ModelProto:
    w = helper.make_tensor("w", initializer_type, [2], [1.0, 2.0])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", initializer_type, [2])], [w])
    return helper.make_model(graph)


def test_float8_weights_ask_for_the_fold_and_float_weights_for_nothing():
    assert so.needed(_graph_with(TensorProto.FLOAT8E4M3FN)) == so.FOLD_FLOAT8
    assert so.needed(_graph_with(TensorProto.FLOAT)) == {}
    assert so.folds_float8({**so.FOLD_FLOAT8, "other": "x"}) and not so.folds_float8({})


def test_the_record_wins_over_the_graph():
    model = _graph_with(TensorProto.FLOAT)
    helper.set_model_props(model, {so.KEY: json.dumps(so.FOLD_FLOAT8)})
    assert so.declared(model) == so.FOLD_FLOAT8
    assert so.declared(_graph_with(TensorProto.FLOAT8E4M3FN)) == so.FOLD_FLOAT8  # no record


def test_a_float_export_records_no_entries(tmp_path):
    art = export_onnx(MHAConfig(dim=32, heads=2), tmp_path / "a", validate=False).path
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    assert so.KEY not in {p.key for p in model.metadata_props}
    assert so.declared(model) == {}


@pytest.mark.parametrize("record, message", [
    ("not json", "flat JSON object"), ('{"session.disable_quant_qdq": 1}', "flat JSON object"),
    ('{"session.intra_op.allow_spinning": "1"}', "may not set")])
def test_a_bad_record_is_refused_in_one_line(record, message):
    """Malformed, or an entry that would override the app's own choice (its threads)."""
    model = _graph_with(TensorProto.FLOAT)
    helper.set_model_props(model, {so.KEY: record})
    with pytest.raises(UsageError, match=message):
        so.declared(model)


def _matmul_nbits_model(elem_type: int, zero_points: bool) -> onnx.ModelProto:
    from mha_export.lossy.projections.kernels import matmul_nbits_probe
    model, _ = matmul_nbits_probe(4, 32, 4, "uint8" if zero_points else "default")
    model.graph.input[0].type.tensor_type.elem_type = elem_type
    return model


def test_half_precision_symmetric_matmul_nbits_ask_for_the_fpa_intb_kernels():
    """ONNX Runtime's CUDA fpA_intB GEMV runs only when asked, on nodes without zero points."""
    assert so.needed(_matmul_nbits_model(TensorProto.FLOAT16, False)) == so.FPA_INTB
    assert so.needed(_matmul_nbits_model(TensorProto.FLOAT16, True)) == {}
    assert so.needed(_matmul_nbits_model(TensorProto.FLOAT, False)) == {}
    assert so.environment(so.FPA_INTB) == {"ORT_FPA_INTB_GEMM": "1"}


def test_an_fp16_int4_export_records_fpa_intb_and_the_cpu_provider_runs_it(tmp_path):
    import numpy as np
    import onnxruntime as ort
    from mha_export.lossy.projections.rtn import QuantSpec
    art = export_onnx(MHAConfig(dim=64, heads=2), tmp_path / "a", validate=False,
                      dtype="float16",
                      quantize=QuantSpec(bits=4)).path
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    assert json.loads({p.key: p.value for p in model.metadata_props}[so.KEY]) == so.FPA_INTB
    opts = ort.SessionOptions()
    for key, value in so.declared(model).items():
        opts.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(art / "model.onnx"), opts,
                                   providers=["CPUExecutionProvider"])
    x = np.zeros((1, 3, 64), np.float16)
    assert session.run(None, {"x": x})[0].shape == (1, 3, 64)
