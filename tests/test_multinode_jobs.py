"""A multi-node cell of a Slurm sweep runs as one job over that many nodes (issue 30, item 2).

Against a real Slurm of two nodes on this one host: ``scripts/local-slurm.sh --nodes 2`` starts one
beside the single-host Slurm of the other tests (two slurmd, core-node1 and core-node2, its own
ports and folder). The sweep is planned on the submitting shell, which is in no allocation: the cell
needs no rendezvous there; inside its job, the run takes the allocation's first node as its
rendezvous and starts a torchrun agent on each node. Without root, Slurm or munge the test skips,
saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from core.cli import main
from core.storage.store import ResultStore

ROOT = Path(__file__).resolve().parent.parent

TWO_NODE_SWEEP = """\
name = "two-nodes"
repeats = 1
timeout_seconds = 600

[grid]
workload = "fcnn"
accelerator = "cpu"
nodes = 2
replicas = 2
steps = 3
warmup_steps = 1
micro_batch_size = 4
power_meter = "none"
workload_options = {layers = 1, hidden_width = 8}

[slurm]
poll_seconds = 1
time_limit_minutes = 10
"""


@pytest.fixture(scope="module")
def two_node_slurm() -> str:
    """SLURM_CONF of the two-node Slurm, started here where it does not answer yet."""
    started = subprocess.run(
        [str(ROOT / "scripts" / "local-slurm.sh"), "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    exports = [line for line in started.stdout.splitlines() if line.startswith("export SLURM_CONF=")]
    if started.returncode != 0 or not exports:
        pytest.skip(f"no two-node Slurm: {started.stderr.strip()[-300:]}")
    return exports[-1].removeprefix("export SLURM_CONF=").strip("'\"")


@pytest.mark.slow
def test_a_two_node_cell_runs_as_one_job_over_both_nodes(
    tmp_path: Path, two_node_slurm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", two_node_slurm)
    for variable in [name for name in os.environ if name.startswith("SLURM_") and name != "SLURM_CONF"]:
        monkeypatch.delenv(variable)  # the submitting shell is in no allocation, as on a login node
    sweep = tmp_path / "two-nodes.toml"
    sweep.write_text(TWO_NODE_SWEEP)
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    with ResultStore(database, create=False) as store:
        (result,) = store.results(sweep="two-nodes")
    assert result.status.ok, result.status
    assert result.config.nodes == 2 and result.config.replicas == 2
    record = json.loads(result.model_dump_json())
    # Both nodes took part, one job: the run lists them by their names in Slurm. (torchrun's
    # rendezvous numbers the nodes in the order their agents arrive, not in Slurm's.)
    assert sorted(node["node_rank"] for node in record["nodes"]) == [0, 1], record["nodes"]
    assert sorted(node["slurm_node"] for node in record["nodes"]) == ["core-node1", "core-node2"], record["nodes"]
    assert result.slurm is not None and result.slurm.nodelist == "core-node[1-2]"
