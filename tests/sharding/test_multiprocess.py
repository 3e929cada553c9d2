"""A multi-controller run on localhost: two processes (2 CPU devices each) join with jax.distributed (gloo
collectives over 127.0.0.1), train on a mesh spanning both (fsdp across the processes, experts inside each),
agree on the loss, save a sharded checkpoint; then this single process (1 device) restores it and continues."""

import os

import jax
import numpy as np
import pytest

import train
from dgemma.loading import load_model
from dgemma.training import checkpointing, metrics
from tests.sharding import common

STEPS = 2


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("multiprocess")
  port = common.free_port()
  specs = [{"port": port, "num_processes": 2, "process_id": i, "workdir": str(tmp / "run"),
            "cache_dir": str(tmp / "data"), "mesh": {"fsdp": 2, "expert": 2}, "steps": STEPS} for i in range(2)]
  ran = common.run_workers("tests.sharding.process_worker", specs, 2)
  return tmp, [r for r, _ in ran], [out for _, out in ran]


def test_processes_agree_and_only_process_0_logs(two_process_run):
  tmp, results, stdouts = two_process_run
  assert [r["process"] for r in results] == [0, 1]
  for r in results:
    assert (r["processes"], r["devices"], r["local_devices"]) == (2, 4, 2)
  # Each process read its own half of every global batch of 8.
  assert [r["data_shard"] for r in results] == [[0, 2, 4], [1, 2, 4]]
  loss = [r["scalars"]["loss"] for r in results]
  assert np.isfinite(loss[0]) and loss[0] == loss[1]
  assert results[0]["scalars"]["grad_norm"] == results[1]["scalars"]["grad_norm"]
  # Process 0 alone prints progress and writes TensorBoard (one event file).
  assert f"step {STEPS}/{STEPS}" in stdouts[0] and "Training " in stdouts[0]
  assert not [line for line in stdouts[1].splitlines() if line.startswith(("step ", "Training ", "Saved "))]
  assert len(os.listdir(tmp / "run" / "tb")) == 1
  scalars = metrics.read_scalars(str(tmp / "run" / "tb"))
  assert [s for s, _ in sorted(scalars["loss"])] == list(range(1, STEPS + 1))


def test_sharded_checkpoint_restores_on_one_process_and_continues(two_process_run):
  tmp, results, _ = two_process_run
  workdir = str(tmp / "run")
  # Both processes wrote their shards of the step-3 checkpoint.
  state_dir = os.path.join(workdir, "checkpoints", str(STEPS), "state")
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(state_dir))
  # The checkpoint, read back on this one device, holds exactly the model the two processes exported.
  _, from_checkpoint, _ = checkpointing.load_inference(workdir, step=STEPS)
  _, exported, _ = load_model(os.path.join(workdir, "model"))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), from_checkpoint, exported))
  # This single process (1 device) restores the sharded state onto its own mesh and trains on.
  assert jax.process_count() == 1 and jax.device_count() == 1
  c = common.config(str(tmp / "data"), None, steps=STEPS + 2)
  out = train.train(c, workdir)
  assert np.isfinite(out["loss"])
  assert checkpointing.Checkpointer(workdir).latest_step() == STEPS + 2
  steps = [s for s, _ in sorted(metrics.read_scalars(os.path.join(workdir, "tb"))["loss"])]
  assert steps == list(range(1, STEPS + 3))
