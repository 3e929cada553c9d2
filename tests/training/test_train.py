"""The training run end to end on the debug config: learning, resume, logs, errors."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import train
from configs import sft_sudoku
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.loading import load_model
from configs.sudoku import official
from dgemma.training import checkpointing, metrics
from tests.script_loader import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def debug_config(tmp_path, arg="size=debug", **changes):
  c = sft_sudoku.get_config(arg)
  c.data.cache_dir = str(tmp_path / "data")
  for key, value in changes.items():
    node = c
    *parents, last = key.split(".")
    for p in parents:
      node = node[p]
    node[last] = value
  return c


def _params(workdir):
  return load_model(os.path.join(workdir, "model"))[1]


def test_loss_goes_down(tmp_path):
  c = debug_config(tmp_path, num_train_steps=60, checkpoint_every=1000, log_every=10,
                   **{"optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 5, "optimizer.decay_steps": 60})
  train.train(c, str(tmp_path / "run"))
  scalars = metrics.read_scalars(str(tmp_path / "run" / "tb"))
  loss = [v for _, v in sorted(scalars["loss"])]
  assert loss[-1] < 0.8 * loss[0], loss


# Plain, with both extra pieces of resumable state at once (ordered-noise draws, moving averages), and with
# Muon's partitioned optimizer state.
@pytest.mark.parametrize("ordered_noise_prob,ema_decays,optimizer_name",
                         [(0.0, (), "adam"), (0.5, (0.9,), "adam"), (0.0, (), "muon")])
def test_killed_run_resumes_bit_identically(tmp_path, ordered_noise_prob, ema_decays, optimizer_name):
  c = debug_config(tmp_path, **{"diffusion.ordered_noise_prob": ordered_noise_prob,  # 6 steps, checkpoint every 3
                                "optimizer.ema_decays": ema_decays, "optimizer.name": optimizer_name})
  train.train(c, str(tmp_path / "straight"))
  # "Killed" after 4 steps: the checkpoint at step 3 survives, step 4 is lost and redone on resume.
  train.train(c, str(tmp_path / "resumed"), stop_at_step=4)
  assert checkpointing.Checkpointer(str(tmp_path / "resumed")).latest_step() == 3
  train.train(c, str(tmp_path / "resumed"))
  for name in ["model"] + [f"model_ema{d:g}" for d in ema_decays]:
    a = load_model(str(tmp_path / "straight" / name))[1]
    b = load_model(str(tmp_path / "resumed" / name))[1]
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)), name
  for d in ema_decays:  # the last checkpoint's moving average, read back, is the exported one
    a = checkpointing.load_inference(str(tmp_path / "resumed"), ema_decay=d)[1]
    b = load_model(str(tmp_path / "resumed" / f"model_ema{d:g}"))[1]
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
  if ema_decays:
    with pytest.raises(ValueError, match="no moving average with decay 0.5"):
      checkpointing.load_inference(str(tmp_path / "resumed"), ema_decay=0.5)
    # scripts/export_model.py writes any saved step's average; a step that was not saved is one error line.
    export = load_script("scripts/export_model.py")
    out = tmp_path / "ema_at_3"
    assert export.main(["export_model.py", f"--workdir={tmp_path / 'resumed'}", "--step=3",
                        f"--ema={ema_decays[0]}", f"--out={out}"]) == 0
    a = checkpointing.load_inference(str(tmp_path / "resumed"), step=3, ema_decay=ema_decays[0])[1]
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, load_model(str(out))[1])
    assert export.main(["export_model.py", f"--workdir={tmp_path / 'resumed'}", "--step=4", f"--out={out}"]) == 1
    with pytest.raises(ValueError, match="ema_decays"):  # resuming with other averages than the checkpoints hold
      train.train(debug_config(tmp_path, **{"optimizer.ema_decays": ()}), str(tmp_path / "resumed"))


def test_moving_averages_are_the_weighted_average_of_the_iterates(tmp_path):
  """After n updates the bias-corrected EMA equals sum_s (1 - d) d^(n - s) p_s / (1 - d^n) over the iterates p_s,
  computed here from the weights recorded after every step."""
  from dgemma.training import optimizer, state as state_lib
  from dgemma.training.config_utils import model_config
  c = debug_config(tmp_path)
  config = model_config(c.model_preset, c.model.to_dict())
  decays = (0.9, 0.5)
  tx = optimizer.make_optimizer(c.optimizer)
  state = state_lib.create(train.build_model(c)[1], tx, 0, jax.random.key(1), ema_decays=decays)
  step = state_lib.make_train_step(config, ObjectiveConfig.from_config(c.diffusion), tx, c.seed, ema_decays=decays,
                                   position_features=c.position_features)
  dataset = iter(train.build_data(c, config)[0])
  iterates = []
  for _ in range(4):
    batch = next(dataset)
    state, _ = step(state, {k: batch[k] for k in ("prompt", "canvas", "canvas_mask")})
    iterates.append(jax.device_get(state.trainable))
  n = len(iterates)
  for i, d in enumerate(decays):
    weights = [(1 - d) * d ** (n - s) / (1 - d ** n) for s in range(1, n + 1)]
    expected = jax.tree.map(lambda *ps: sum(w * np.asarray(p, np.float64) for w, p in zip(weights, ps)), *iterates)
    got = jax.device_get(state_lib.ema_trainable(state, i, d))
    # float32 averaging rounds by a few ulps of the iterates' size, also where the average is near 0.
    scale = jax.tree.map(lambda *ps: max(float(np.abs(p).max()) for p in ps), *iterates)
    jax.tree.map(lambda g, e, s: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6 * s), got, expected, scale)
  # The averages differ from the last weights (the test would pass trivially otherwise).
  assert not np.allclose(jax.tree.leaves(got)[0], jax.tree.leaves(iterates[-1])[0])
  with pytest.raises(ValueError, match="ema_decays"):
    state_lib.create(train.build_model(c)[1], tx, 0, jax.random.key(1), ema_decays=(1.0,))


def test_tensorboard_has_per_noise_level_tags(tmp_path):
  train.train(debug_config(tmp_path, "size=debug,official=true"), str(tmp_path / "run"))
  tags = set(metrics.read_scalars(str(tmp_path / "run" / "tb")))
  for tag in ("loss", "diffusion_loss", "ar_loss", "learning_rate", "grad_norm", "tokens_per_second",
              "examples_per_second"):
    assert tag in tags, tag
  assert len([t for t in tags if t.startswith("loss_by_t/")]) >= 3  # 6 steps x 4 examples hit several bins


def test_lora_trains_only_adapters_and_merges(tmp_path):
  c = debug_config(tmp_path, lora_rank=2, num_train_steps=3)
  train.train(c, str(tmp_path / "base_run"))
  c2 = debug_config(tmp_path, lora_rank=2, num_train_steps=3, init_from=str(tmp_path / "base_run" / "model"),
                    **{"optimizer.learning_rate": 1e-2, "optimizer.warmup_steps": 1})
  train.train(c2, str(tmp_path / "lora_run"))
  base, tuned = _params(str(tmp_path / "base_run")), _params(str(tmp_path / "lora_run"))
  changed = {jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_flatten_with_path(
      jax.tree.map(lambda a, b: bool(np.any(a != b)), base, tuned))[0] if x}
  assert any("q_proj" in k for k in changed) and any("mlp" in k for k in changed)
  assert not any("embedding" in k or "norm" in k for k in changed), changed


def test_training_continues_on_a_grown_model(tmp_path):
  """scripts/grow_model.py's output trains with init_from and the new depth; the inserted layers learn."""
  from dgemma import checkpoints, grow
  train.train(debug_config(tmp_path, num_train_steps=3), str(tmp_path / "base_run"))
  config, params, metadata = load_model(str(tmp_path / "base_run" / "model"))
  checkpoints.save_model(str(tmp_path / "grown"), *grow.grow_depth(config, params, [0, 1]), metadata)
  shallow = debug_config(tmp_path, num_train_steps=3, init_from=str(tmp_path / "grown"))
  with pytest.raises(ValueError, match=r"config.model.num_layers=2 differs from the init_from checkpoint \(4\)"):
    train.train(shallow, str(tmp_path / "wrong_depth"))
  c = debug_config(tmp_path, num_train_steps=3, init_from=str(tmp_path / "grown"),
                   **{"model.num_layers": 4, "optimizer.warmup_steps": 1})
  train.train(c, str(tmp_path / "grown_run"))
  tuned = _params(str(tmp_path / "grown_run"))
  for inserted in ("layer_1", "layer_3"):
    assert float(np.abs(tuned[inserted]["post_ffw_norm"]["scale"]).max()) > 0, inserted


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  c = debug_config(tmp_path, num_train_steps=12)
  train.train(c, str(tmp_path / "run"), stop_at_step=3)  # a good checkpoint at step 3
  c.optimizer.learning_rate = 1e30  # diverges on resume
  c.optimizer.warmup_steps = 1
  c.allow_changes = "optimizer.learning_rate,optimizer.warmup_steps"  # (a resume refuses them otherwise)
  with pytest.raises(train.TrainingError, match="last good checkpoint is step 3"):
    train.train(c, str(tmp_path / "run"))
  assert checkpointing.Checkpointer(str(tmp_path / "run")).latest_step() == 3


def test_weights_that_overflowed_are_not_checkpointed(tmp_path):
  """The loss is computed before the update: weights an update broke show only in the next step's loss, after a
  checkpoint of them may have been written. The error then names the checkpoint before it."""
  c = debug_config(tmp_path, num_train_steps=12)
  train.train(c, str(tmp_path / "run"), stop_at_step=3)  # a good checkpoint at step 3
  c.optimizer.learning_rate, c.optimizer.warmup_steps, c.checkpoint_every = 1e30, 1, 4  # step 4: finite loss
  c.allow_changes = "optimizer.learning_rate,optimizer.warmup_steps"  # (a resume refuses them otherwise)
  message = (r"loss is nan at step 5, computed from the weights checkpointed at step 4; stopping. The last good "
             f"checkpoint is step 3: move {tmp_path / 'run' / 'checkpoints' / '4'} away to resume from it")
  with pytest.raises(train.TrainingError, match=message):
    train.train(c, str(tmp_path / "run"))


def test_all_finite():
  from dgemma.training.state import all_finite
  tree = {"w": np.ones((3, 2), np.float32), "step": np.int32(7), "key": jax.random.key(0)}
  assert bool(all_finite(tree))
  for bad in (np.nan, np.inf, -np.inf):
    assert not bool(all_finite(dict(tree, w=np.array([[1.0, bad]], np.float32))))


def test_resume_refuses_another_model_and_a_damaged_checkpoint(tmp_path):
  c = debug_config(tmp_path, num_train_steps=12)
  run = tmp_path / "run"
  train.train(c, str(run), stop_at_step=6)  # checkpoints at steps 3 and 6
  run_json = (run / "run.json").read_text()
  wider = debug_config(tmp_path, num_train_steps=12, **{"model.width": c.model.width * 2})
  with pytest.raises(ValueError, match=r"holds a run with another config \(model.width: 32 -> 64\)"):
    train.train(wider, str(run))
  wider.allow_changes = "model.width"  # (the checkpoints' shapes cannot change, whatever the config allows)
  with pytest.raises(ValueError, match=r"holds checkpoints of another model \(config.model differs in .*width: 32 -> 64"):
    train.train(wider, str(run))
  assert (run / "run.json").read_text() == run_json  # still describes the checkpoints
  # Damaged array data in the latest checkpoint: one line naming it, and the way back to the one before.
  for d, _, fs in os.walk(run / "checkpoints" / "6" / "state"):
    for name in fs:
      if os.path.basename(d) == "d":  # OCDBT's data files (the weights and the optimizer state alike)
        with open(os.path.join(d, name), "r+b") as f:
          f.truncate(os.path.getsize(os.path.join(d, name)) // 2)
  message = f"checkpoint {run / 'checkpoints' / '6'} cannot be read .*; move it away to resume from step 3"
  with pytest.raises(checkpointing.CheckpointError, match=message):
    train.train(c, str(run))
  with pytest.raises(checkpointing.CheckpointError, match=message):
    checkpointing.load_inference(str(run))


@pytest.mark.parametrize("key", ["checkpoint_every", "log_every", "keep_checkpoints"])
def test_counts_must_be_positive(tmp_path, key):
  with pytest.raises(ValueError, match=f"config.{key} must be a positive integer, got 0"):
    train.train(debug_config(tmp_path, **{key: 0}), str(tmp_path / "run"))


def _run_cli(*args):
  return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_errors_are_one_line(tmp_path):
  bad_key = _run_cli("--config=configs/sft_sudoku.py:size=debug", "--config.no_such_key=1",
                     f"--workdir={tmp_path}/a")
  assert bad_key.returncode != 0
  assert "no_such_key" in bad_key.stderr and "Traceback" not in bad_key.stderr
  missing = _run_cli("--config=configs/sft_sudoku.py:size=debug", f"--config.init_from={tmp_path}/nope",
                     f"--workdir={tmp_path}/b")
  assert missing.returncode != 0
  assert missing.stderr.strip().splitlines()[-1] == f"train.py: error: checkpoint {tmp_path}/nope does not exist"
  bad_variant = _run_cli("--config=configs/sft_sudoku.py:size=huge", f"--workdir={tmp_path}/c")
  assert bad_variant.returncode != 0 and "unknown size 'huge'" in bad_variant.stderr


def test_ordered_noise_needs_the_digit_task(tmp_path):
  c = debug_config(tmp_path, **{"diffusion.ordered_noise_prob": 0.5, "task.name": "sudoku_text"})
  with pytest.raises(ValueError, match="ordered_noise_prob > 0 needs a task whose batches carry a noise order; "
                                       "task.name='sudoku_text' has none"):
    train.build_data(c, train.build_model(c)[0])


def test_official_text_format_from_an_hf_checkpoint(tmp_path):
  """The real-model variant (`:init=DIR`, LoRA, text format with the checkpoint's tokenizer) on a tiny random
  HF DiffusionGemma with a tiny character tokenizer saved beside it."""
  from tests.tasks.sudoku.test_sudoku_text import CHARS, SPECIALS, _save_tokenizer
  from tests.hf_reference import random_hf_model
  ckpt = tmp_path / "hf"
  random_hf_model(seed=0, vocab_size=len(SPECIALS) + len(CHARS) + 1).save_pretrained(ckpt)
  _save_tokenizer(str(ckpt / "tokenizer.json"))
  c = official.get_config(f"init={ckpt},size=debug")
  c.data.cache_dir = str(tmp_path / "data")
  c.data.num_train, c.data.prompt_len = 50, 512
  c.model.canvas_length = 168
  c.num_train_steps, c.batch_size, c.log_every, c.checkpoint_every = 2, 2, 1, 2
  out = train.train(c, str(tmp_path / "run"))
  assert np.isfinite(out["loss"]) and out["ar_loss"] > 0  # the official recipe's AR loss is on
  config, params, meta = load_model(str(tmp_path / "run" / "model"))
  assert meta["task"]["name"] == "sudoku_text" and config.canvas_length == 168
  assert meta["self_conditioning"] is True  # the official recipe trains it (and the checkpoint had it)


def test_evaluation_during_training_is_logged_and_matches_the_saved_model(tmp_path):
  """eval/* scalars land in TensorBoard at every eval.every steps; the last one equals solving the same held-out
  puzzles with the saved model (recomputed here through the public solver)."""
  from dgemma.tasks.sudoku import puzzles as sudoku, digits as sudoku_task
  from dgemma.sampling import SamplerConfig
  from dgemma.tasks.sudoku import task as sudoku_solver
  c = debug_config(tmp_path, **{"eval.every": 3, "eval.num_puzzles": 4, "eval.max_steps": 6,
                                "sampler.t_max": 1.3, "sampler.t_min": 0.9})
  train.train(c, str(tmp_path / "run"))
  scalars = metrics.read_scalars(str(tmp_path / "run" / "tb"))
  assert [s for s, _ in scalars["eval/cell_accuracy"]] == [3, 6]
  config, params, metadata = load_model(str(tmp_path / "run" / "model"))
  data = sudoku.generate_dataset(4, c.eval.seed, c.data.min_clues, c.data.max_clues)
  # Trained with self-conditioning (the default self_cond_prob=0.5): recorded, and the evaluation sampled with it.
  assert c.diffusion.self_cond_prob == 0.5 and metadata["self_conditioning"] is True
  # The config's sampling defaults are recorded with the model, and the evaluation sampled with them.
  assert metadata["sampler"] == {"t_max": 1.3, "t_min": 0.9, "confidence_threshold": c.sampler.confidence_threshold,
                                 "restart_after": c.sampler.restart_after}
  result = sudoku_solver.solve(params, sudoku_solver.load_task(config, metadata), np.asarray(data["puzzle"]),
                               jax.random.key(c.eval.seed),
                               SamplerConfig(max_denoising_steps=6, t_max=1.3, t_min=0.9,
                                             confidence_threshold=c.sampler.confidence_threshold,
                                             restart_after=c.sampler.restart_after, self_conditioning=True),
                               metadata["position_features"])
  expected = sudoku_task.score(np.asarray(data["puzzle"]), np.asarray(data["solution"]), result.predictions)
  assert scalars["eval/cell_accuracy"][-1][1] == pytest.approx(expected["cell_accuracy"])
  assert scalars["eval/mean_steps"][-1][1] == pytest.approx(float(np.mean(result.steps)))
  with pytest.raises(ValueError, match="eval.seed"):
    train.train(debug_config(tmp_path, **{"eval.every": 3, "eval.seed": c.data.seed}), str(tmp_path / "bad"))
  with pytest.raises(ValueError, match="eval.num_puzzles >= 1, got 3 and 0"):
    train.train(debug_config(tmp_path, **{"eval.every": 3, "eval.num_puzzles": 0}), str(tmp_path / "bad"))
  assert not os.path.exists(tmp_path / "bad" / "checkpoints")  # refused before any step


@pytest.mark.parametrize("num_bins", [1, 3, 4, 10, 20, 64])
def test_loss_by_t_tags_name_each_bin(num_bins):
  """One distinct tag per bin of t, whose edges are the bin's edges to the tag's precision."""
  tags = metrics.bin_tags(num_bins)
  assert len(set(tags)) == num_bins
  for k, tag in enumerate(tags):
    low, high = (float(x) for x in tag.removeprefix("loss_by_t/").split("-"))
    decimals = len(tag.split("-")[-1].split(".")[1])
    assert abs(low - k / num_bins) <= 0.5 * 10 ** -decimals + 1e-12
    assert abs(high - (k + 1) / num_bins) <= 0.5 * 10 ** -decimals + 1e-12
  if num_bins == 10:
    assert tags[0] == "loss_by_t/0.0-0.1"  # the default's tags, as the README names them


def test_init_model_records_what_train_records(tmp_path):
  """scripts/init_model.py's untrained model carries the config's task, sampler and self-conditioning choice, as
  the model train.py exports from the same config does."""
  c = debug_config(tmp_path, num_train_steps=1)
  train.train(c, str(tmp_path / "run"))
  proc = subprocess.run([sys.executable, "scripts/init_model.py", "--config=configs/sft_sudoku.py:size=debug",
                         f"--out={tmp_path / 'untrained'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  trained, untrained = (load_model(str(p))[2] for p in (tmp_path / "run" / "model", tmp_path / "untrained"))
  for key in ("task", "sampler", "self_conditioning"):
    assert untrained[key] == trained[key], key
  assert untrained["sampler"]  # the debug config has sampler knobs, so this compares something


def test_load_inference_leaves_the_optimizer_state_on_disk(tmp_path, monkeypatch):
  """Exporting weights restores the weights (and step, averages), not Adam's moments: the same parameters as the
  run's own export, with the optimizer state never requested from orbax."""
  import orbax.checkpoint as ocp
  train.train(debug_config(tmp_path, num_train_steps=3), str(tmp_path / "run"))
  requested = []
  real = ocp.CheckpointManager.restore

  def spy(self, step, args=None, **kw):
    requested.append(set(args["state"].item))  # the subtrees asked for
    return real(self, step, args=args, **kw)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", spy)
  params = checkpointing.load_inference(str(tmp_path / "run"))[1]
  assert requested == [{"step", "trainable", "frozen", "ema"}]
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), params, _params(str(tmp_path / "run"))))
