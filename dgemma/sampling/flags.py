"""Command-line flags for the sampler's knobs, made from SamplerConfig's fields (their help, type, choices and
default: dgemma/sampling/config.py is the one place they are stated), and the SamplerConfig the parsed flags ask for.

    FLAGS = flags.FlagValues()
    sampler_flags.define(FLAGS)                               # --steps, --t_max, ...: one flag per knob
    ...
    sampler = sampler_flags.sampler_config(FLAGS, metadata)  # the flag, else the checkpoint's, else SamplerConfig's

Every flag's default is unset (None): a knob left unset takes the checkpoint's recorded sampler default where it
has one, else SamplerConfig's, which the help shows in brackets.
"""

from __future__ import annotations

import dataclasses
import types
import typing

from absl import flags

from dgemma.sampling import config as _config
from dgemma.sampling.config import SamplerConfig

KNOBS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(SamplerConfig)}
_TYPES = typing.get_type_hints(SamplerConfig)
AUTO = "auto"  # the unset value of a knob whose flag offers choices for a boolean (self_conditioning's auto/on/off)


def flag_name(knob: str) -> str:
  """The command-line name of a SamplerConfig knob's flag."""
  return KNOBS[knob].metadata.get("flag", knob)


def _value_type(knob: str) -> type:
  """The knob's type without its None (`int | None` -> int; `tuple[int, ...] | None` -> tuple)."""
  kind = _TYPES[knob]
  if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
    (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
  return typing.get_origin(kind) or kind


def _help(field: dataclasses.Field) -> str:
  default = field.default
  if field.metadata.get("choices") and _value_type(field.name) is bool:
    default = AUTO
  shown = "" if default is None else f" [{str(default).lower() if isinstance(default, bool) else default}]"
  return field.metadata["help"] + shown


def define(flag_values: flags.FlagValues, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None
           ) -> tuple[str, ...]:
  """Defines in `flag_values` one flag per SamplerConfig knob (those in `only` where given, less those in `skip`:
  the knobs a script sets itself); returns the knobs' names."""
  unknown = sorted((set(skip) | set(only or ())) - set(KNOBS))
  if unknown:
    raise ValueError(f"not SamplerConfig knobs: {unknown}")
  names = tuple(n for n in KNOBS if (only is None or n in only) and n not in skip)
  for knob in names:
    field, kind, name = KNOBS[knob], _value_type(knob), flag_name(knob)
    help_text, choices = _help(field), field.metadata.get("choices")
    if choices:  # a string knob's values, or a boolean's auto/on/off
      flags.DEFINE_enum(name, None, list(choices), help_text, flag_values=flag_values)
    elif kind is bool:
      flags.DEFINE_bool(name, None, help_text, flag_values=flag_values)
    elif kind is int:
      flags.DEFINE_integer(name, None, help_text, flag_values=flag_values)
    elif kind is float:
      flags.DEFINE_float(name, None, help_text, flag_values=flag_values)
    elif kind is tuple:  # token ids: "1,2,3", or "none" for the empty tuple
      flags.DEFINE_string(name, None, help_text, flag_values=flag_values)
    else:
      raise TypeError(f"SamplerConfig.{knob}: no flag for type {_TYPES[knob]}")
  return names


def _parse_ids(text: str, name: str) -> tuple[int, ...]:
  if text.strip().lower() == "none":
    return ()
  try:
    ids = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
  except ValueError:
    raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None
  if not ids:
    raise ValueError(f"--{name} is empty")
  return ids


def given(flag_values: flags.FlagValues) -> dict:
  """{knob: value} for the knobs whose flags are defined in `flag_values` and set on the command line."""
  out = {}
  for knob in KNOBS:
    name = flag_name(knob)
    if name not in flag_values or flag_values[name].value is None:
      continue
    value = flag_values[name].value
    if _value_type(knob) is tuple:
      value = _parse_ids(value, name)
    elif _value_type(knob) is bool and isinstance(value, str):  # auto/on/off
      if value == AUTO:
        continue
      value = value == "on"
    out[knob] = value
  return out


def sampler_config(flag_values: flags.FlagValues, metadata: dict | None = None, **fixed) -> SamplerConfig:
  """The SamplerConfig that parsed flags ask for. Each knob: its flag where set, else `fixed` (what the script
  sets itself, such as return_trajectory), else the checkpoint's recorded default (`metadata`, see
  config.sampler_config), else SamplerConfig's. self_conditioning left at auto asks the checkpoint whether its
  self-conditioning branch trained (config.self_conditioning_for)."""
  knobs = {**fixed, **given(flag_values)}
  if "self_conditioning" not in knobs and flag_name("self_conditioning") in flag_values:
    knobs["self_conditioning"] = _config.self_conditioning_for(metadata, AUTO)
  return _config.sampler_config(metadata, **knobs)
