"""ObjectiveConfig: the official recipe's defaults, one-line refusals of bad knobs, conversion from a config."""

import dataclasses

import ml_collections
import optax
import pytest

from configs import sft_sudoku
from dgemma.config import tiny_moe
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.training import state as state_lib


def test_defaults_are_the_official_recipe():
  """Spec §3-4: linear schedule, t ~ U[1e-4, 1 - 1e-4], flat CE + AR loss on [prompt ‖ canvas] (weights 1, 1),
  self-conditioning with probability 0.5 from one no-gradient pass; no research option on."""
  assert dataclasses.asdict(ObjectiveConfig()) == dict(
      schedule="linear", t_eps=1e-4, loss="flat_ce", num_noise_bins=10, diffusion_loss_weight=1.0,
      ar_loss_weight=1.0, ar_targets="all", self_cond_prob=0.5, self_cond_passes=1, t_tilt=0.0, t_tilt_steps=0,
      noise_draws=1, ordered_noise_prob=0.0, loss_chunk_tokens=0, cache_gradient=True)
  hash(ObjectiveConfig())  # jit closes over it
  with pytest.raises(dataclasses.FrozenInstanceError):
    ObjectiveConfig().t_eps = 0.1


@pytest.mark.parametrize("knobs,match", [
    (dict(schedule="quadratic"), "diffusion.schedule must be one of"),
    (dict(loss="mse"), "diffusion.loss must be one of"),
    (dict(ar_targets="prompt"), "diffusion.ar_targets must be one of"),
    (dict(t_eps=0.0), r"diffusion.t_eps must be in \(0, 0.5\)"),
    (dict(t_eps=0.5), r"diffusion.t_eps must be in \(0, 0.5\)"),
    (dict(t_eps=float("nan")), "diffusion.t_eps must be a finite number in float32"),
    (dict(t_tilt=1e39), "diffusion.t_tilt must be a finite number in float32"),  # finite in Python, not there
    (dict(t_tilt=-1.0), "diffusion.t_tilt must be > -1"),
    (dict(ar_loss_weight=-1.0), "diffusion.ar_loss_weight must be >= 0"),
    (dict(diffusion_loss_weight=0.0, ar_loss_weight=0.0), "nothing to train"),
    (dict(self_cond_prob=1.5), r"diffusion.self_cond_prob must be in \[0, 1\]"),
    (dict(ordered_noise_prob=-0.1), r"diffusion.ordered_noise_prob must be in \[0, 1\]"),
    (dict(self_cond_passes=0), "diffusion.self_cond_passes must be >= 1"),
    (dict(cache_gradient="no"), "diffusion.cache_gradient must be true or false"),
    (dict(self_cond_passes=1.5), "diffusion.self_cond_passes must be an integer"),
    (dict(noise_draws=0), "diffusion.noise_draws must be >= 1"),
    (dict(num_noise_bins=0), "diffusion.num_noise_bins must be >= 1"),
    (dict(t_tilt_steps=-1), "diffusion.t_tilt_steps must be >= 0"),
    (dict(t_tilt_steps=True), "diffusion.t_tilt_steps must be an integer"),
    (dict(self_cond_prob="0.5"), "diffusion.self_cond_prob must be a finite number"),
    (dict(loss_chunk_tokens=-1), "diffusion.loss_chunk_tokens must be >= 0"),
    (dict(loss_chunk_tokens=2.5), "diffusion.loss_chunk_tokens must be an integer"),
])
def test_bad_knobs_are_refused_in_one_line(knobs, match):
  with pytest.raises(ValueError, match=match) as e:
    ObjectiveConfig(**knobs)
  assert "\n" not in str(e.value)


def test_from_config_takes_a_config_section_and_refuses_unknown_knobs():
  section = ml_collections.ConfigDict(dict(self_cond_passes=2, t_tilt=1.0, t_tilt_steps=1000))
  assert ObjectiveConfig.from_config(section) == ObjectiveConfig(self_cond_passes=2, t_tilt=1.0, t_tilt_steps=1000)
  assert ObjectiveConfig.from_dict({}) == ObjectiveConfig()
  # The removed knobs are unknown now: a config that still sets one fails at start-up, not silently.
  for removed in ("focus_gamma", "self_cond_random_passes", "self_cond_grad_passes"):
    with pytest.raises(ValueError, match=rf"unknown diffusion knob\(s\) \['{removed}'\]; known: \[") as e:
      ObjectiveConfig.from_config(ml_collections.ConfigDict({removed: 0}))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arg", ["size=debug", "objective=ar,size=debug"])  # the baseline runs' recipes
def test_every_sudoku_recipe_converts(arg):
  c = sft_sudoku.get_config(arg)
  objective = ObjectiveConfig.from_config(c.diffusion)
  assert dataclasses.asdict(objective) == c.diffusion.to_dict()  # every knob of the section, none lost


def test_train_step_takes_the_dataclass_not_a_config_section():
  with pytest.raises(TypeError, match=r"ObjectiveConfig.from_config\(c.diffusion\)"):
    state_lib.make_train_step(tiny_moe(), ml_collections.ConfigDict(dict(self_cond_prob=0.5)), optax.sgd(0.1), 0)
