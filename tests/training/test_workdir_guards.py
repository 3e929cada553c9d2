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


def test_mesh_and_sharding_may_change_on_resume():
  """Checkpoints restore onto any mesh or process count (tests/sharding/test_multiprocess.py)."""
  saved = run_config.to_json(_config(mesh=ml_collections.ConfigDict(dict(fsdp=2, expert=2))))
  resumed = _config(mesh=ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1)),
                    sharding_rules=(("batch", ("data", "fsdp")),))
  run_config.check_resume(saved, resumed, "w", 6)


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


def test_knobs_added_later_resume_runs_saved_without_them():
  """A run saved before grad_accum_steps and diffusion.loss_chunk_tokens existed ran with 1 and 0: the same values
  resume it; another accumulation is a change (other noise draws); another loss chunk is not (the same numbers)."""
  saved = run_config.to_json(_config())
  run_config.check_resume(saved, _config(grad_accum_steps=1, diffusion=ml_collections.ConfigDict(
      dict(loss_chunk_tokens=0))), "w", 6)
  run_config.check_resume(saved, _config(diffusion=ml_collections.ConfigDict(dict(loss_chunk_tokens=4096))), "w", 6)
  run_config.check_resume(saved, _config(diffusion=ml_collections.ConfigDict(dict(cache_gradient=True))), "w", 6)
  with pytest.raises(ValueError, match=r"diffusion.cache_gradient: True -> False"):
    run_config.check_resume(saved, _config(diffusion=ml_collections.ConfigDict(dict(cache_gradient=False))), "w", 6)
  with pytest.raises(ValueError, match=r"grad_accum_steps: 1 -> 2"):
    run_config.check_resume(saved, _config(grad_accum_steps=2), "w", 6)


def test_fewer_steps_than_reached_is_refused():
  saved = run_config.to_json(_config())
  with pytest.raises(ValueError, match="already at step 6, past num_train_steps=3"):
    run_config.check_resume(saved, _config(num_train_steps=3), "w", 6)


# --- train.py end to end (debug config, a few steps) ------------------------------------------------------------

import json  # noqa: E402
import time  # noqa: E402

import train  # noqa: E402
from dgemma.loading import load_model  # noqa: E402
from dgemma.training import checkpointing  # noqa: E402
from tests.training.test_train import ROOT, debug_config  # noqa: E402


def _train_cli(*args, **kwargs):
  return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                        **kwargs)


def test_second_train_py_on_a_workdir_is_refused_naming_the_first(tmp_path):
  """Two real train.py processes on one workdir: the second stops in one line naming the first's pid and host,
  before writing anything; the first is unharmed."""
  workdir = tmp_path / "w"
  common = ["--config=configs/sft_sudoku.py:size=debug", f"--config.data.cache_dir={tmp_path}/data",
            f"--workdir={workdir}"]
  first = subprocess.Popen([sys.executable, "train.py", *common, "--config.num_train_steps=100000",
                            "--config.checkpoint_every=100000"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  try:
    lock_file = workdir / ".lock"
    for _ in range(600):  # the first run holds the workdir once it has written its pid
      if lock_file.exists() and lock_file.read_text().startswith(f"pid {first.pid} "):
        break
      assert first.poll() is None, "the first run ended early"
      time.sleep(0.1)
    else:
      pytest.fail("the first run never took the workdir")
    second = _train_cli(*common, "--config.seed=7")
    assert second.returncode == 1
    assert second.stderr.strip().splitlines()[-1] == (
        f"train.py: error: {workdir} is in use by pid {first.pid} on host {os.uname().nodename}: one run per workdir "
        "(wait for it, stop it, or choose another --workdir)")
    assert first.poll() is None  # still running
  finally:
    first.kill()
    first.wait()


@pytest.mark.parametrize("args, message", [
    (["--config=configs/nope.py"], "config file configs/nope.py does not exist"),
    (["--config=configs/sft_sudoku.py:size=debug", "--workdir={file}"],
     "workdir {file} is a file, not a directory: choose another --workdir"),
    (["--config=configs/sft_sudoku.py:size=debug", "--workdir={file}/run"],  # cannot be created, even by root
     "workdir {file}/run cannot be written (Not a directory): choose another --workdir"),
    (["--config=configs/sft_sudoku.py:size=debug", "--workdir=/proc/dgemma_run"],  # nor here
     "workdir /proc/dgemma_run cannot be written (No such file or directory): choose another --workdir"),
    (["--config=configs/sft_sudoku.py:size=debug", "--config.batch_size=-4", "--workdir={tmp}/bs"],
     "config.batch_size must be a positive integer, got -4"),
])
def test_bad_command_lines_are_one_line(tmp_path, args, message):
  (tmp_path / "file").write_text("not a directory")
  fill = dict(file=tmp_path / "file", tmp=tmp_path)
  proc = _train_cli(*[a.format(**fill) for a in args])
  assert proc.returncode == 1
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == "train.py: error: " + message.format(**fill)


def test_run_json_and_the_model_record_the_config_and_the_code(tmp_path):
  c = debug_config(tmp_path, num_train_steps=3)
  train.train(c, str(tmp_path / "run"))
  info = json.loads((tmp_path / "run" / "run.json").read_text())
  assert info["config"] == json.loads(json.dumps(c.to_dict()))  # the whole resolved config
  assert info["config"]["num_train_steps"] == 3 and info["config"]["data"]["cache_dir"] == str(tmp_path / "data")
  assert info["code_version"] == run_config.code_version()
  assert info["code_version"].startswith(("git ", "dgemma "))
  metadata = load_model(str(tmp_path / "run" / "model"))[2]
  assert metadata["train_config"] == info["config"] and metadata["code_version"] == info["code_version"]
  metadata = checkpointing.load_inference(str(tmp_path / "run"))[2]  # what export_model.py writes from a workdir
  assert metadata["train_config"] == info["config"] and metadata["code_version"] == info["code_version"]


@pytest.fixture(scope="module")
def at_step_6(tmp_path_factory):
  """A workdir stopped at step 6 of 12 (checkpoints at 3 and 6); tests copy it."""
  tmp_path = tmp_path_factory.mktemp("at6")
  c = debug_config(tmp_path, num_train_steps=12)
  train.train(c, str(tmp_path / "run"), stop_at_step=6)
  return tmp_path


def _copy(at_step_6, tmp_path):
  import shutil
  shutil.copytree(at_step_6 / "run", tmp_path / "run")
  return debug_config(at_step_6, num_train_steps=12), tmp_path / "run"


def test_resume_with_another_seed_is_refused_unless_allowed(at_step_6, tmp_path):
  c, run = _copy(at_step_6, tmp_path)
  run_json = (run / "run.json").read_text()
  c.seed = 7
  with pytest.raises(ValueError, match=rf"^{run} holds a run with another config \(seed: 42 -> 7\): resume with the "
                                       r"same settings, use a new workdir, or allow them with "
                                       r"--config.allow_changes=seed$"):
    train.train(c, str(run))
  assert (run / "run.json").read_text() == run_json  # nothing written
  assert checkpointing.finished_steps(str(run)) == [3, 6]
  c.allow_changes = "seed"
  train.train(c, str(run))  # goes on to step 12
  assert checkpointing.finished_steps(str(run))[-1] == 12
  assert json.loads((run / "run.json").read_text())["config"]["seed"] == 7


def test_resume_with_fewer_steps_than_reached_is_refused(at_step_6, tmp_path):
  c, run = _copy(at_step_6, tmp_path)
  c.num_train_steps = 3
  with pytest.raises(ValueError, match=rf"^{run} is already at step 6, past num_train_steps=3: give at least 6 steps"):
    train.train(c, str(run))
  assert not (run / "model").exists()


def test_resume_of_an_old_run_json_checks_the_model_and_the_steps(at_step_6, tmp_path):
  """A run.json written before the whole config was saved: the model and the step count are still checked."""
  c, run = _copy(at_step_6, tmp_path)
  info = json.loads((run / "run.json").read_text())
  del info["config"]
  (run / "run.json").write_text(json.dumps(info))
  c.num_train_steps = 3
  with pytest.raises(ValueError, match="is already at step 6, past num_train_steps=3"):
    train.train(c, str(run))
  c.num_train_steps, c.model.width = 12, 64
  with pytest.raises(ValueError, match="holds checkpoints of another model"):
    train.train(c, str(run))


def test_a_half_written_run_json_is_named(at_step_6, tmp_path):
  c, run = _copy(at_step_6, tmp_path)
  (run / "run.json").write_text((run / "run.json").read_text()[:100])
  message = rf"^{run / 'run.json'} is damaged \(not valid JSON: .*\); restore it, or use a new workdir$"
  with pytest.raises(ValueError, match=message):
    train.train(c, str(run))
  with pytest.raises(ValueError, match=message):
    checkpointing.load_inference(str(run))


def _damage(step_dir):
  for d, _, fs in os.walk(step_dir / "state"):
    for name in fs:
      if os.path.basename(d) == "d":  # OCDBT's data files
        with open(os.path.join(d, name), "r+b") as f:
          f.truncate(os.path.getsize(os.path.join(d, name)) // 2)


def test_when_every_checkpoint_is_damaged_none_is_named_to_resume_from(at_step_6, tmp_path):
  c, run = _copy(at_step_6, tmp_path)
  for step in (3, 6):
    _damage(run / "checkpoints" / str(step))
  message = (rf"^checkpoint {run / 'checkpoints' / '6'} cannot be read .*; the older checkpoints \(step 3\) cannot "
             r"be read either: every checkpoint of this workdir is damaged, start again in a new workdir$")
  with pytest.raises(checkpointing.CheckpointError, match=message):
    train.train(c, str(run))
  with pytest.raises(checkpointing.CheckpointError, match=message):
    checkpointing.load_inference(str(run))


def test_zero_steps_is_refused(tmp_path):
  with pytest.raises(ValueError, match="config.num_train_steps must be a positive integer, got 0"):
    train.train(debug_config(tmp_path, num_train_steps=0), str(tmp_path / "run"))
  assert not (tmp_path / "run" / "model").exists()


def test_nan_loss_before_any_checkpoint_says_so(tmp_path):
  c = debug_config(tmp_path, num_train_steps=12, checkpoint_every=10, **{"optimizer.learning_rate": 1e30,
                                                                          "optimizer.warmup_steps": 1})
  with pytest.raises(train.TrainingError, match=r"stopping. No checkpoint was written before it: the run has nothing "
                                                r"to resume from"):
    train.train(c, str(tmp_path / "run"))


def test_paths_compare_as_absolute_and_eval_may_change(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "sub").mkdir()
  base = _config()
  base.data = ml_collections.ConfigDict(dict(path="sub/d.jsonl"))
  saved = run_config.to_json(base)
  assert saved["data"]["path"] == str(tmp_path / "sub" / "d.jsonl")
  same = _config(**{"eval.every": 10})
  same.data = ml_collections.ConfigDict(dict(path=str(tmp_path / "sub" / "d.jsonl")))
  same.eval.data = "held_out.jsonl"  # what is measured during the run, not the weights
  run_config.check_resume(saved, same, "w", 6)
  monkeypatch.chdir(tmp_path / "sub")  # the same relative name from another directory is another file
  with pytest.raises(ValueError, match="data.path"):
    run_config.check_resume(saved, base, "w", 6)
