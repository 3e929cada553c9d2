"""SamplerConfig: the block-diffusion sampler's knobs, each with its default and its help text (the one place both
live; dgemma/sampling/flags.py makes the command-line flags from them), and how a checkpoint's recorded defaults
combine with the knobs a caller sets."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dgemma.config import ModelConfig
from dgemma.cpu import token_stats as cpu_kernel
from dgemma.diffusion import elbo, schedules as noise_schedules
from dgemma.sampling import schedules

UPDATES = ("acceptance", "ancestral")


def _knob(default, help: str, **flag):  # noqa: A002 (absl's word)
  """A SamplerConfig field: its default, its one-line help, and how its flag differs from the plain one (`flag`:
  another name; `choices`: the values a string knob takes)."""
  return dataclasses.field(default=default, metadata=dict(help=help, **flag))


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Sampler knobs; the defaults are the released model's (HF `generation_config.json`).

  `canvas_length=None` and `stop_ids=None` take the model config's values. Hashable: jit specialises on it.
  """

  max_denoising_steps: int = _knob(48, "Maximum denoising steps per canvas (all attempts of a row together).",
                                   flag="steps")
  entropy_bound: float = _knob(0.1, "Entropy budget of the acceptance rule.")
  t_max: float = _knob(0.8, "Temperature at the first step.")
  t_min: float = _knob(0.4, "Temperature the schedule approaches at the last step.")
  schedule: str = _knob("linear", "Temperature schedule: linear (HF's), cosine, or constant (t_max throughout).",
                        choices=schedules.SCHEDULES)
  adaptive_stopping: bool = _knob(True, "Stop a row's canvas once it is stable and confident.")
  stability_threshold: int = _knob(1, "Previous argmax canvases that must match to stop.")
  confidence_threshold: float = _knob(0.005, "Mean entropy below which a canvas is confident.")
  max_new_tokens: int = _knob(256, "Generate canvases until at least this many tokens.")
  canvas_length: int | None = _knob(None, "Canvas length (unset: the model's).")
  stop_ids: tuple[int, ...] | None = _knob(
      None, "Stop token ids, comma-separated; 'none' never stops early (unset: the model's).")
  return_trajectory: bool = _knob(False, "Also return the argmax canvas of every step.")
  self_conditioning: bool = _knob(
      True, "Feed each step the previous step's tempered logits; off: every step denoises as the first does, for "
      "models trained without self-conditioning (self_cond_prob=0), whose self-conditioning layers never learned "
      "anything. The flag's 'auto': off where the checkpoint records that it trained without.",
      choices=("auto", "on", "off"))
  restart_after: int = _knob(
      0, "Restart a row not stopped after this many steps of its attempt, within the step budget (0: never): a "
      "fresh random canvas, no self-conditioning signal, no stop history, the temperature schedule started again "
      "over min(this, steps left).")
  update: str = _knob(
      "acceptance", "How a step changes the canvas: 'acceptance', the released sampler's (sample, keep the tokens "
      "the entropy bound accepts, renoise the rest); 'ancestral', the exact reverse step of the noise process from "
      "t to t - 1/steps, every step run (needs --adaptive_stopping=false; --schedule=constant --t_max=1: the "
      "model's own distribution, the one its ELBO bounds).", choices=UPDATES)
  noise_schedule: str = _knob(
      "linear", "update=ancestral: the noise schedule alpha(t) the model was trained with (a checkpoint's "
      "recorded diffusion.schedule where unset).", choices=tuple(noise_schedules.SCHEDULES))
  denoiser_output: str = _knob(
      "full", "update=ancestral: what the denoiser's softmax is, 'full' p(x0 | x_t) (flat cross-entropy) or "
      "'context' p(x0_l | the other tokens) (loss=elbo); a checkpoint's recorded loss decides where unset.",
      choices=elbo.DENOISER_OUTPUTS)
  # The same tokens either way, up to summation order. True: canvases {0}, {1}, {2, 3}, {4..7}, ... share a bucket,
  # which reads the prompt and 0, 1, 3, 7, ... canvases; 1 + ceil(log2 n) copies of the step loop for n canvases,
  # and each canvas of a bucket but the last copies that much of the cache once. False: the least compile time
  # (early canvases attend over slots not yet written, hidden by the mask). The Pallas kernel already skips key
  # blocks past the written end, so that the buckets would save little there and cost compile time.
  cache_per_canvas: bool | None = _knob(
      None, "Each canvas's steps read only the cache written before it, rounded up to doubling buckets (one compiled "
      "step loop per bucket); false: every canvas reads the whole cache, one step loop (unset: true, but false "
      "with the Pallas attention kernel).")
  # "auto" takes XLA where the kernel does not fit (several devices, a vocabulary that is not a multiple of 16) and,
  # with a warning naming the reason, where it does not build. The same tokens up to float32 rounding.
  token_stats: str = _knob(
      "auto", "How each step's arg-max, entropy, sample and softmax run: 'cpu', one C++ kernel built on first use "
      "with the system compiler ($CXX or g++); 'xla', plain XLA; 'auto', the kernel on a single CPU device where "
      "it builds.", choices=cpu_kernel.IMPLS)

  def __post_init__(self):
    if self.stop_ids is not None:
      object.__setattr__(self, "stop_ids", tuple(int(t) for t in self.stop_ids))
    for name in ("max_denoising_steps", "max_new_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if self.canvas_length is not None and (isinstance(self.canvas_length, bool) or self.canvas_length < 1):
      raise ValueError(f"canvas_length must be a positive integer, got {self.canvas_length!r}")
    if isinstance(self.restart_after, bool) or not isinstance(self.restart_after, (int, np.integer)) \
        or self.restart_after < 0:
      raise ValueError(f"restart_after must be an integer >= 0, got {self.restart_after!r}")
    if self.restart_after and not self.adaptive_stopping:
      raise ValueError("restart_after > 0 needs adaptive_stopping: without a stop no attempt ever ends early")
    if isinstance(self.stability_threshold, bool) or self.stability_threshold < 0:
      raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")
    for name in ("t_max", "t_min", "entropy_bound", "confidence_threshold"):  # the sampler computes in float32
      value = getattr(self, name)
      with np.errstate(over="ignore"):  # (1e39 becomes inf in float32: that is what is refused)
        finite = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) \
            and bool(np.isfinite(np.float32(value)))
      if not finite:
        raise ValueError(f"{name} must be a finite float32 number (|x| < 3.4e38), got {value!r}")
    if not self.entropy_bound > 0:
      raise ValueError(f"entropy_bound must be > 0, got {self.entropy_bound!r}")
    if not self.confidence_threshold > 0:
      raise ValueError(f"confidence_threshold must be > 0, got {self.confidence_threshold!r}")
    schedules.check(self.schedule, self.t_max, self.t_min)
    if self.update not in UPDATES:
      raise ValueError(f"update must be one of {UPDATES}, got {self.update!r}")
    if self.update == "ancestral" and (self.adaptive_stopping or self.restart_after):
      raise ValueError("update='ancestral' runs every step from t = 1 to t = 0: it needs adaptive_stopping=False "
                       "and restart_after=0 (--adaptive_stopping=false)")
    noise_schedules.get(self.noise_schedule)
    if self.denoiser_output not in elbo.DENOISER_OUTPUTS:
      raise ValueError(f"denoiser_output must be one of {elbo.DENOISER_OUTPUTS}, got {self.denoiser_output!r}")
    if self.token_stats not in cpu_kernel.IMPLS:
      raise ValueError(f"token_stats must be one of {cpu_kernel.IMPLS}, got {self.token_stats!r}")

  def resolve(self, config: ModelConfig) -> "SamplerConfig":
    """This config with the model's canvas length and stop ids, the cache layout for its attention and the
    implementation of the token statistics for this backend filled in where unset."""
    return dataclasses.replace(
        self, token_stats=cpu_kernel.resolve(self.token_stats, config.vocab_size),
        canvas_length=self.canvas_length or config.canvas_length,
        stop_ids=config.stop_ids if self.stop_ids is None else self.stop_ids,
        cache_per_canvas=(config.attention_impl != "pallas" if self.cache_per_canvas is None
                          else self.cache_per_canvas))

  def num_canvases(self, canvas_length: int) -> int:
    return math.ceil(self.max_new_tokens / canvas_length)


# The knobs a checkpoint may record as its own sampling defaults (HF keeps them in generation_config.json; `update`
# has no HF equivalent, so an HF export leaves it out).
RECORDABLE = ("max_denoising_steps", "entropy_bound", "t_max", "t_min", "schedule", "adaptive_stopping",
              "stability_threshold", "confidence_threshold", "restart_after", "update")


def sampler_config(metadata: dict | None = None, **overrides) -> SamplerConfig:
  """The sampler for a checkpoint: each knob from `overrides` where given (None: not given), else from the
  checkpoint's recorded defaults (`metadata["sampler"]`, written by train.py from the config's `sampler`
  section), else SamplerConfig's (the released model's). Turning adaptive stopping off drops recorded restarts
  (they need stops); asking for both is an error. The ancestral step's noise schedule and denoiser output come
  from the checkpoint's training config where it records one (`metadata["train_config"]["diffusion"]`)."""
  recorded = dict((metadata or {}).get("sampler") or {})
  trained = ((metadata or {}).get("train_config") or {}).get("diffusion") or {}
  if "schedule" in trained:
    recorded.setdefault("noise_schedule", trained["schedule"])
  if "loss" in trained:
    recorded.setdefault("denoiser_output", elbo.denoiser_output_for(trained["loss"]))
  unknown = sorted(set((metadata or {}).get("sampler") or {}) - set(RECORDABLE))
  if unknown:
    raise ValueError(f"checkpoint records unknown sampler defaults {unknown}; known: {list(RECORDABLE)}")
  if overrides.get("adaptive_stopping") is False and overrides.get("restart_after") is None:
    recorded.pop("restart_after", None)  # a fixed-steps run asked for: the recorded restarts need stops, so none
  return SamplerConfig(**{**recorded, **{k: v for k, v in overrides.items() if v is not None}})


def self_conditioning_for(metadata: dict | None, choice: str = "auto") -> bool:
  """Whether to self-condition when sampling a checkpoint with this metadata. choice "on" / "off" decides;
  "auto": yes unless its training run recorded that the self-conditioning branch never trained
  (`"self_conditioning": false`, written by train.py for self_cond_prob=0 from scratch). Released
  checkpoints carry no such record and use it."""
  if choice not in ("auto", "on", "off"):
    raise ValueError(f"self-conditioning choice must be auto, on or off, got {choice!r}")
  if choice != "auto":
    return choice == "on"
  return bool((metadata or {}).get("self_conditioning", True))
