"""One process of the two-process text resume test (tests/sharding/test_text_resume.py): train.train runs the
text task uninterrupted, then resumes a copy of its workdir from an earlier checkpoint, recording a digest of every
batch this process reads. Prints one `RESULT {json}` line.

    python -m tests.sharding.text_resume_worker '{"port": ..., "process_id": 0, "data": ..., "root": ..., ...}'
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys


class _Recorded:
  """The task's dataset, whose iterators note a digest of each batch into `digests`."""

  def __init__(self, dataset, digests: list):
    self.dataset, self.digests = dataset, digests

  def __iter__(self):
    return _RecordingIterator(iter(self.dataset), self.digests)


class _RecordingIterator:
  def __init__(self, it, digests: list):
    self.it, self.digests = it, digests

  def __next__(self):
    batch = next(self.it)
    h = hashlib.sha256()
    for key in sorted(batch):
      h.update(key.encode() + batch[key].tobytes())
    self.digests.append(h.hexdigest())
    return batch

  def get_state(self):
    return self.it.get_state()

  def set_state(self, state):
    self.it.set_state(state)


def rows(n: int = 40) -> list[dict]:
  """Text records; every fourth prompt is too long for the debug model's 32 prompt tokens, so with
  prompt_overflow=skip process 0 (records 0, 2, 4, ...) drops some of its records and process 1 none."""
  return [{"prompt": ("a long prompt that does not fit " * 2 if i % 4 == 0 else f"Say {i}."),
           "response": f"{i} and {i + 1}."} for i in range(n)]


def config(data: str, steps: int, checkpoint_at: int):
  from configs import text as text_config
  c = text_config.get_config(f"data={data},size=debug")
  c.data.prompt_overflow = "skip"
  c.num_train_steps, c.checkpoint_every, c.keep_checkpoints = steps, checkpoint_at, 10
  return c


def main(spec: dict) -> None:
  from dgemma import sharding
  assert sharding.maybe_initialize_distributed(f"127.0.0.1:{spec['port']}", spec["num_processes"],
                                               spec["process_id"], initialization_timeout=60)
  import jax
  from jax.experimental import multihost_utils

  import train

  digests: list = []
  build_data = train.build_data
  train.build_data = lambda *a, **k: (lambda ds, meta: (_Recorded(ds, digests), meta))(*build_data(*a, **k))
  c = config(spec["data"], spec["steps"], spec["checkpoint_at"])
  runs = {}
  train.train(c, f"{spec['root']}/full")
  runs["full"] = list(digests)
  # The uninterrupted run's workdir as a run stopped at its checkpoint `checkpoint_at` leaves it, then resumed.
  if jax.process_index() == 0:
    shutil.copytree(f"{spec['root']}/full", f"{spec['root']}/resumed",
                    ignore=lambda d, names: [n for n in names if n in ("model", "tb") or
                                             (d.endswith("checkpoints") and n != str(spec["checkpoint_at"]))])
  multihost_utils.sync_global_devices("copied")
  digests.clear()
  train.train(c, f"{spec['root']}/resumed")
  runs["rest"] = list(digests)
  print("RESULT " + json.dumps({"process": jax.process_index(), "runs": runs}), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
