"""Multi-process text resume: two processes (one CPU device each) train the text task with records skipped on one
process only, so their data iterators stand at different positions; a run resumed from a checkpoint reads exactly
the batches of the uninterrupted run on each process. Resuming such a checkpoint on one process is refused."""

import json
import os

import pytest

import train
from dgemma.training import data_state
from tests.sharding import common, text_resume_worker

STEPS, CHECKPOINT_AT = 4, 2


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("text_resume")
  data = tmp / "train.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in text_resume_worker.rows()))
  port = common.free_port()
  specs = [{"port": port, "num_processes": 2, "process_id": i, "data": str(data), "root": str(tmp),
            "steps": STEPS, "checkpoint_at": CHECKPOINT_AT} for i in range(2)]
  results = [r for r, _ in common.run_workers("tests.sharding.text_resume_worker", specs, 1)]
  return tmp, data, results


def _saved_states(workdir: str, step: int) -> list:
  with open(os.path.join(workdir, "checkpoints", str(step), "data", "metadata")) as f:  # (orbax's JSON item)
    return json.load(f)[data_state.KEY]


def test_each_process_resumes_at_its_own_position(two_process_runs):
  tmp, _, results = two_process_runs
  assert [r["process"] for r in results] == [0, 1]
  # The processes stood at different positions of their shards at the checkpoint (process 0 skipped records):
  # one state for both would resume one of them elsewhere.
  states = _saved_states(str(tmp / "resumed"), CHECKPOINT_AT)
  assert len(states) == 2 and states[0] != states[1]
  for r in results:
    full, rest = r["runs"]["full"], r["runs"]["rest"]
    assert len(full) == STEPS and len(set(full)) == STEPS
    assert rest == full[CHECKPOINT_AT:]
  assert results[0]["runs"]["full"] != results[1]["runs"]["full"]  # (each process reads its own shard)


def test_another_process_count_is_refused_when_positions_differ(two_process_runs):
  tmp, data, _ = two_process_runs
  c = text_resume_worker.config(str(data), STEPS + 1, CHECKPOINT_AT)
  with pytest.raises(ValueError, match=r"^checkpoint .*checkpoints/4 was written by 2 processes whose data "
                                       r"iterators stand at different positions .* cannot resume on 1: resume it "
                                       r"with 2 processes, or use a new workdir$"):
    train.train(c, str(tmp / "resumed"))
