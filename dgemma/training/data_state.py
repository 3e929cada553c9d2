"""The data iterators' states in a checkpoint: every process's, so that a resumed run puts each process where it
was. Processes can stand at different positions of their own shards (a task that drops records drops different
numbers on each), so one process's state is not the others'.

Saved as {"per_process": [state of process 0, state of process 1, ...]} (JSON, in the checkpoint's `data` item).
A checkpoint resumes with the process count that wrote it; with another count only when all its processes stood
at the same position (each process then continues at that position of its own new shard, as a run that drops no
records does); otherwise it is refused in one line. Checkpoints of older runs hold one state, process 0's, which
every process takes.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

KEY = "per_process"


def gather(state: Any) -> dict:
  """{"per_process": [every process's `state`, in process order]}, on every process. A collective: all processes
  call it (at the same step)."""
  if jax.process_count() == 1:
    return {KEY: [state]}
  from jax.experimental import multihost_utils
  encoded = np.frombuffer(json.dumps(state).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([encoded.size], np.int32))).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)  # (the gather needs one shape on every process)
  padded[:encoded.size] = encoded
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return {KEY: [json.loads(rows[i, :n].tobytes().decode()) for i, n in enumerate(lengths)]}


def this_process(saved: Any, where: str) -> Any:
  """This process's state from a checkpoint's `saved` data state; a one-line ValueError naming the checkpoint
  (`where`) when the processes it was written by stood at different positions and their count is not this run's."""
  if not (isinstance(saved, dict) and set(saved) == {KEY}):
    return saved  # an older checkpoint: process 0's state, for every process
  states = saved[KEY]
  if len(states) == jax.process_count():
    return states[jax.process_index()]
  if all(s == states[0] for s in states):
    return states[0]
  raise ValueError(f"checkpoint {where} was written by {len(states)} processes whose data iterators stand at "
                   f"different positions (some skipped records), so it cannot resume on {jax.process_count()}: "
                   f"resume it with {len(states)} processes, or use a new workdir")
