"""dgemma/sampling/flags.py: one flag per SamplerConfig knob, and flags -> SamplerConfig with the precedence
flag > checkpoint's recorded default > SamplerConfig's."""

import dataclasses

import pytest
from absl import flags

from dgemma.sampling import SamplerConfig
from dgemma.sampling import flags as sampler_flags
from tests.script_loader import load_script

# A value for every knob that differs from its default (and is valid together with the others).
CHANGED = dict(max_denoising_steps=7, entropy_bound=0.25, t_max=1.5, t_min=1.2, schedule="cosine",
               adaptive_stopping=True, stability_threshold=3, confidence_threshold=0.02, max_new_tokens=100,
               canvas_length=16, stop_ids=(1, 106), return_trajectory=True, self_conditioning=False,
               restart_after=4, cache_per_canvas=False, token_stats="xla", noise_schedule="cosine",
               denoiser_output="context")
# Knobs whose changed value needs others at their defaults (update="ancestral": no stop, no restarts).
CHANGED_WITHOUT_STOPS = dict(update="ancestral")


def _parsed(argv, **define):
  values = flags.FlagValues()
  names = sampler_flags.define(values, **define)
  values(["prog", *argv])
  return values, names


def _argv(config: SamplerConfig, knobs) -> list[str]:
  """Command-line arguments written by hand from each knob's type: what a user types to ask for `config`."""
  out = []
  for knob in knobs:
    name, value = sampler_flags.flag_name(knob), getattr(config, knob)
    if knob == "self_conditioning":
      out.append(f"--{name}={'on' if value else 'off'}")
    elif isinstance(value, bool):
      out.append(f"--{name}" if value else f"--no{name}")
    elif isinstance(value, tuple):
      out.append(f"--{name}={','.join(map(str, value)) or 'none'}")
    else:
      out.append(f"--{name}={value}")
  return out


def test_every_knob_has_exactly_one_flag():
  fields = [f.name for f in dataclasses.fields(SamplerConfig)]
  assert set(CHANGED) | set(CHANGED_WITHOUT_STOPS) == set(fields)  # this test covers every knob
  values, names = _parsed([])
  assert names == tuple(fields)
  flag_names = [sampler_flags.flag_name(k) for k in fields]
  assert len(set(flag_names)) == len(fields)
  assert sorted(values) == sorted(flag_names)  # nothing else defined, nothing missing
  assert sampler_flags.flag_name("max_denoising_steps") == "steps"  # sample.py's name for it
  for knob in fields:  # unset by default; the help shows SamplerConfig's default where it has one
    flag = values[sampler_flags.flag_name(knob)]
    assert flag.default is None and flag.value is None
    default = getattr(SamplerConfig(), knob)
    if knob == "self_conditioning":
      assert flag.help.endswith("[auto]")
    elif default is not None:
      assert flag.help.endswith(f"[{str(default).lower() if isinstance(default, bool) else default}]"), knob


def test_flags_round_trip_to_the_config():
  config = SamplerConfig(**CHANGED)
  assert all(getattr(config, k) != getattr(SamplerConfig(), k) for k in CHANGED if k != "adaptive_stopping")
  values, names = _parsed(_argv(config, CHANGED))
  assert sampler_flags.sampler_config(values) == config
  off = dataclasses.replace(config, adaptive_stopping=False, restart_after=0, stop_ids=(), self_conditioning=True)
  values, _ = _parsed(_argv(off, CHANGED))
  assert sampler_flags.sampler_config(values) == off
  ancestral = dataclasses.replace(off, **CHANGED_WITHOUT_STOPS)
  values, _ = _parsed(_argv(ancestral, {**CHANGED, **CHANGED_WITHOUT_STOPS}))
  assert sampler_flags.sampler_config(values) == ancestral


def test_unset_flags_take_the_checkpoints_defaults_then_sampler_configs():
  recorded = {"sampler": {"t_max": 1.5, "t_min": 1.1, "max_denoising_steps": 3}, "self_conditioning": False}
  values, _ = _parsed([])
  assert sampler_flags.sampler_config(values) == SamplerConfig()
  assert sampler_flags.sampler_config(values, recorded) == SamplerConfig(t_max=1.5, t_min=1.1, max_denoising_steps=3,
                                                                         self_conditioning=False)
  values, _ = _parsed(["--t_min=0.7", "--steps=2", "--self_conditioning=on"])
  assert sampler_flags.sampler_config(values, recorded) == SamplerConfig(t_max=1.5, t_min=0.7, max_denoising_steps=2)
  values, _ = _parsed(["--self_conditioning=auto"])
  assert sampler_flags.sampler_config(values, recorded).self_conditioning is False
  # What the script fixes itself comes after its flags, before the checkpoint's.
  values, _ = _parsed(["--steps=5"], skip=("return_trajectory",))
  fixed = sampler_flags.sampler_config(values, recorded, return_trajectory=True, max_denoising_steps=9)
  assert (fixed.return_trajectory, fixed.max_denoising_steps) == (True, 5)


def test_a_subset_of_flags_and_bad_values():
  values, names = _parsed(["--token_stats=xla"], only=("cache_per_canvas", "token_stats"))
  assert names == ("cache_per_canvas", "token_stats") and sorted(values) == ["cache_per_canvas", "token_stats"]
  assert sampler_flags.sampler_config(values) == SamplerConfig(token_stats="xla")  # the others: defaults
  with pytest.raises(ValueError, match=r"not SamplerConfig knobs: \['steps'\]"):
    sampler_flags.define(flags.FlagValues(), skip=("steps",))
  values, _ = _parsed(["--stop_ids=1,x"])
  with pytest.raises(ValueError, match="--stop_ids must be comma-separated integers, got '1,x'"):
    sampler_flags.sampler_config(values)
  with pytest.raises(flags.IllegalFlagValueError, match="should be one of"):
    _parsed(["--schedule=square"])


@pytest.mark.parametrize("script, skipped", [
    ("sample.py", {"return_trajectory"}),
    ("scripts/eval_sudoku.py", {"return_trajectory", "max_new_tokens", "canvas_length", "stop_ids"}),
])
def test_scripts_take_their_sampler_flags_from_sampler_config(script, skipped):
  module = load_script(script)
  for knob in sampler_flags.KNOBS:
    name = sampler_flags.flag_name(knob)
    if knob in skipped:
      assert name not in module.FLAGS, name
    else:
      reference, _ = _parsed([], only=(knob,))
      assert module.FLAGS[name].help == reference[name].help, name
