"""One run per workdir (a lock the kernel releases with its holder) and resume refusing a changed run."""

import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from dgemma.training import run_config
from dgemma.training.workdir_lock import WorkdirBusy, WorkdirLock


def test_second_holder_is_refused_naming_the_first(tmp_path):
  with WorkdirLock(str(tmp_path)):
    with pytest.raises(WorkdirBusy, match=f"pid {os.getpid()} on host"):
      WorkdirLock(str(tmp_path)).acquire()
  WorkdirLock(str(tmp_path)).acquire().release()  # released: free again


def test_lock_held_by_another_process_and_freed_by_its_death(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import sys, time
      from dgemma.training.workdir_lock import WorkdirLock
      WorkdirLock({str(tmp_path)!r}).acquire()
      print("held", flush=True)
      time.sleep(60)
      """)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(WorkdirBusy, match=f"pid {holder.pid} "):
      WorkdirLock(str(tmp_path)).acquire()
  finally:
    holder.kill()  # as kill -9: no clean-up code runs
    holder.wait()
  WorkdirLock(str(tmp_path)).acquire().release()


def _config(**overrides) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(dict(seed=42, num_train_steps=10, batch_size=4, log_every=1, allow_changes="",
                                     optimizer=dict(learning_rate=1e-3, b1=0.9), model=dict(width=32, remat=False),
                                     eval=dict(every=5), sharding_rules=(("batch", ("data",)),)))
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return c


def test_same_run_resumes():
  saved = run_config.to_json(_config())
  run_config.check_resume(saved, _config(), "w", 6)
  run_config.check_resume(saved, _config(num_train_steps=20, log_every=5, **{"eval.every": 0, "model.remat": True}),
                          "w", 6)


@pytest.mark.parametrize("key,value", [("seed", 7), ("batch_size", 8), ("optimizer.learning_rate", 3e-3),
                                       ("model.width", 64)])
def test_changed_setting_is_refused_naming_it(key, value):
  saved = run_config.to_json(_config())
  with pytest.raises(ValueError, match=rf"another config \({key}: .* -> {value!r}\).*allow_changes={key}$"):
    run_config.check_resume(saved, _config(**{key: value}), "w", 6)


def test_allow_changes_lets_named_keys_change():
  saved = run_config.to_json(_config())
  run_config.check_resume(saved, _config(seed=7, allow_changes="seed"), "w", 6)
  with pytest.raises(ValueError, match="batch_size"):
    run_config.check_resume(saved, _config(seed=7, batch_size=8, allow_changes="seed"), "w", 6)


def test_fewer_steps_than_reached_is_refused():
  saved = run_config.to_json(_config())
  with pytest.raises(ValueError, match="already at step 6, past num_train_steps=3"):
    run_config.check_resume(saved, _config(num_train_steps=3), "w", 6)
