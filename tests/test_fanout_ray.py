"""The Ray executor (fanout/executors/ray_tasks.py) on a simulated two-node cluster
(ray.cluster_utils.Cluster, one CPU a node), one Ray session shared by these tests: the local
executor's verdicts, layers placed on both nodes, faults and dead workers as their rows."""
import functools
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FANOUT_CHECK, FANOUT_LAYERS
import faults
from mha_export.fanout import check_layers, export_layers

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    made.add_node(num_cpus=1)
    ray.init(address=made.address, include_dashboard=False, log_to_driver=False)
    # the planted crash lives in tests/, which Ray's workers cannot import: send it by value
    ray.cloudpickle.register_pickle_by_value(faults)
    yield made
    ray.shutdown()
    made.shutdown()


def verdicts(summary) -> dict:
    """What must not depend on the executor: each layer's status, worst error, costs."""
    return {r.layer: (r.status, r.worst_rel, r.worst_runner, r.costs, r.fingerprint)
            for r in summary.records}


def test_ray_gives_the_local_verdicts_on_both_nodes(cluster, smollm2_layers, smollm2_gguf,
                                                    tmp_path):
    local = smollm2_layers[1]
    summary = export_layers("onnx", smollm2_gguf, FANOUT_LAYERS, tmp_path / "run",
                            executor="ray", check_options=FANOUT_CHECK)
    assert summary.passed and verdicts(summary) == verdicts(local)
    nodes = {r.worker.split(" node ")[1] for r in summary.records}
    assert len(nodes) == 2, [r.worker for r in summary.records]
    written = json.loads((tmp_path / "run" / "layers.json").read_text())
    assert written["executor"] == {"name": "ray", "where": "the Ray session of this process",
                                   "at_once": 2, "threads": 1}


def test_ray_check_finds_the_planted_fault(cluster, smollm2_layers, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(smollm2_layers[0], out)
    faults.permute_heads(out / "layer-2" / "model.onnx", 64)
    summary = check_layers(out, executor="ray", seq_lens=[1, 7], batch_sizes=[1])
    assert {r.layer: r.status for r in summary.records} == {0: "pass", 1: "pass", 2: "fail"}
    local = check_layers(out, seq_lens=[1, 7], batch_sizes=[1], jobs=2)
    assert verdicts(summary) == verdicts(local)


def test_ray_a_dead_worker_is_crashed_and_never_retried(cluster, smollm2_gguf, tmp_path):
    summary = export_layers("onnx", smollm2_gguf, "0-1", tmp_path / "run", executor="ray",
                            check_options=FANOUT_CHECK,
                            work=functools.partial(faults.exit_on_layer, 0))
    statuses = {r.layer: r.status for r in summary.records}
    assert statuses == {0: "crashed", 1: "pass"} and summary.complete


def test_ray_a_layer_larger_than_every_node_is_infeasible(cluster, smollm2_gguf, tmp_path):
    summary = export_layers("onnx", smollm2_gguf, "0", tmp_path / "run", executor="ray",
                            memory=10**13)
    record = summary.records[0]
    assert record.status == "infeasible" and "2 nodes" in record.message


def test_ray_from_the_command_line_at_an_address(cluster, smollm2_layers, tmp_path):
    """A new process joins the cluster by its address (auto: RAY_ADDRESS, probed first) and
    checks the folder."""
    out = tmp_path / "run"
    shutil.copytree(smollm2_layers[0], out)
    done = subprocess.run([sys.executable, "-m", "mha_export", "check", str(out),
                           "--executor", "ray", "--ray-address", "auto",
                           "--seq-lens", "1,7", "--batch-sizes", "1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": cluster.address})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: 3 layers (3 pass)" in done.stdout


def test_ray_an_address_other_than_the_sessions_is_refused(cluster, smollm2_gguf, tmp_path):
    """A process with a Ray session runs on it; an address naming another cluster is one line
    (it was ignored), the session's own address by another name is fine."""
    from mha_export.errors import UsageError
    with pytest.raises(UsageError, match="already has a Ray session, at .*pass no address"):
        export_layers("onnx", smollm2_gguf, "0", tmp_path / "run", executor="ray",
                      ray_address="127.0.0.1:1")
    assert not (tmp_path / "run").exists() and ray.is_initialized()
    from mha_export.fanout.executors import make_executor
    port = cluster.address.rsplit(":", 1)[1]
    with make_executor("ray", address=f"localhost:{port}") as same:
        assert same.describe()["where"] == "the Ray session of this process"
    assert ray.is_initialized()  # the caller's session is left as it was


def test_ray_without_an_address_never_joins_the_machines_cluster(cluster, smollm2_layers,
                                                                  tmp_path):
    """This module's cluster is the machine's latest (ray_current_cluster, as `ray start` writes
    it): a new process without --ray-address starts a private Ray rather than joining it (it
    failed: "When connecting to an existing cluster, num_cpus ... must not be provided")."""
    out = tmp_path / "run"
    shutil.copytree(smollm2_layers[0], out)
    for layer in (1, 2):  # one layer checked: their rows are kept as they were
        shutil.rmtree(out / f"layer-{layer}")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "mha_export", "check", str(out),
                           "--executor", "ray", "--seq-lens", "1", "--batch-sizes", "1"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads((out / "layers.json").read_text())
    assert written["executor"]["where"].startswith("a local Ray started for this run")
    ours = {n["NodeID"][:8] for n in ray.nodes()}
    (row,) = [r for r in written["layers"] if r["layer"] == 0]
    assert row["status"] == "pass" and row["worker"].split(" node ")[1] not in ours
