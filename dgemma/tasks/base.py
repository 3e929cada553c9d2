"""The task interface: everything train.py, sample.py and the eval scripts need to know about a task.

A task turns its own data into model examples (`prompt` / `canvas` / `canvas_mask` token batches), reads the
model's canvases back into answers, scores them and shows them. The generic code never looks inside: it calls
these methods on the object the registry (`dgemma.tasks`) builds from `config.task.name` when training, or from
the `task` entry of a checkpoint's metadata when sampling. See docs/tasks.md for a complete toy task.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import numpy as np

from dgemma.sampling import display

if TYPE_CHECKING:  # (annotations only)
  import grain
  import ml_collections

  from dgemma.config import ModelConfig
  from dgemma.sampling.display import Frame
  from dgemma.sampling.generate import SamplerConfig

# params -> {"eval/<metric>": value}: the task's held-out scores of one set of weights, and texts (str values, e.g.
# generated samples) that TensorBoard and the log show as they are. train.py adds "eval/seconds" and logs them all.
Evaluator = Callable[[dict], dict[str, float | str]]


@runtime_checkable
class Task(Protocol):
  """One task bound to one model. Built by the class methods of the registered class:

  - `from_config(c, config)`: for training, from the run's ConfigDict and model config;
  - `from_metadata(config, metadata, ckpt_path)`: for sampling, from the checkpoint's `metadata["task"]`.

  Both give the same object for the same model, so what training records is what sampling reads.
  """

  name: str  # the registry key (config.task.name), recorded in the checkpoint
  title: str  # how messages name the task's checkpoints, e.g. "a {title} checkpoint"
  prompt_len: int  # prompt tokens per example (training batches and sampling prompts alike)
  config: ModelConfig  # the model config with the task's special ids (pad, BOS, EOS, stop ids)
  supports_noise_rank: bool  # whether train_dataset(noise_rank=True) works (diffusion.ordered_noise_prob > 0)

  @property
  def metadata(self) -> dict[str, Any]:
    """JSON-able; stored as the checkpoint's `metadata["task"]` and read back by `from_metadata`.
    Holds at least {"name": self.name}."""

  def export_files(self, directory: str) -> dict[str, Any]:
    """Writes the files the task needs at sampling time (e.g. a tokenizer) into the exported model's
    `directory`; returns the metadata to record there (`metadata`, with those files named relative to it)."""

  # --- Training ---------------------------------------------------------------------------------------
  def train_dataset(self, c: ml_collections.ConfigDict, batch_size: int, shard_index: int, shard_count: int,
                    noise_rank: bool) -> grain.IterDataset:
    """An infinite stream of training batches: {"prompt": [B, prompt_len] int32, "canvas": [B, C] int32,
    "canvas_mask": [B, C] bool} (+ "noise_rank": [B, C] float32 when `noise_rank`, for tasks that
    support it). This process reads shard `shard_index` of `shard_count` disjoint shards, B =
    `batch_size` rows per batch; the iterator's get_state()/set_state() resume it exactly."""

  def make_evaluator(self, c: ml_collections.ConfigDict, metadata: dict) -> Evaluator | None:
    """The in-training evaluation (None: none configured). `metadata` is the run's checkpoint metadata
    (sampler defaults, self-conditioning)."""

  def describe(self, scores: dict[str, float]) -> str:
    """One line summarising an evaluator's scores (its texts left out), e.g. '41.0% of puzzles solved'."""

  # --- Sampling ---------------------------------------------------------------------------------------
  def parse_prompt(self, text: str) -> np.ndarray:
    """A prompt as typed on the command line -> the task's input (one row of `encode`'s argument)."""

  def encode(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B, ...] inputs -> ([B, prompt_len] int32 tokens, [B, prompt_len] bool valid), exactly as in training."""

  def decode(self, tokens_BxT: np.ndarray) -> np.ndarray:
    """[B, T] generated tokens -> [B, ...] answers."""

  def sampler(self, sampler_config: SamplerConfig) -> SamplerConfig:
    """The task's sampler settings (canvas length, stop ids, ...) on top of the given knobs."""

  fixed_sampler_flags: tuple[str, ...]  # sample.py flags the task sets itself (refused on the command line)

  def first_valid(self, inputs: np.ndarray, answers: np.ndarray) -> int | None:
    """Among several answers to one input, the index of the first that passes the task's own check (no
    reference answer needed), else None. sample.py --samples=K answers with it."""

  def show(self, inputs: np.ndarray, answer: np.ndarray) -> str:
    """One answer for the terminal (possibly several lines), with the task's check of it."""

  def frames(self, trajectory_SxC: np.ndarray, steps: int) -> list[Frame]:
    """The step-by-step pictures of one canvas (the first `steps` of the trajectory's argmax canvases)."""

  def token_text(self, token: int) -> str:
    """One token as display text (sample.py --stream's live view)."""


@dataclasses.dataclass(frozen=True)
class TaskBase:
  """Defaults for the optional parts of `Task`; a task subclasses it and writes `name`, `from_config`,
  `from_metadata`, `train_dataset`, `parse_prompt`, `encode` and `decode` (docs/tasks.md)."""

  prompt_len: int
  config: ModelConfig
  name = ""
  supports_noise_rank = False
  fixed_sampler_flags = ("canvas_length", "max_new_tokens", "stop_ids")  # see `sampler`

  @property
  def title(self) -> str:
    return self.name

  @property
  def metadata(self) -> dict[str, Any]:
    return {"name": self.name, "prompt_len": self.prompt_len}

  def export_files(self, directory: str) -> dict[str, Any]:
    return self.metadata  # no files of its own

  def make_evaluator(self, c: ml_collections.ConfigDict, metadata: dict) -> Evaluator | None:
    return None  # no in-training evaluation

  def describe(self, scores: dict[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('eval/')} {v:.4g}" for k, v in scores.items() if k != "eval/seconds")

  def sampler(self, sampler_config: SamplerConfig) -> SamplerConfig:
    """One canvas of the model's canvas length that stops on the task's stop ids; the other knobs as given."""
    return dataclasses.replace(sampler_config, canvas_length=self.config.canvas_length,
                               max_new_tokens=self.config.canvas_length, stop_ids=self.config.stop_ids)

  def first_valid(self, inputs: np.ndarray, answers: np.ndarray) -> int | None:
    return None  # no check of its own: --samples answers with the first draw

  def show(self, inputs: np.ndarray, answer: np.ndarray) -> str:
    return " ".join(str(x) for x in np.ravel(answer))

  def token_text(self, token: int) -> str:
    return f"{token} "

  def frames(self, trajectory_SxC: np.ndarray, steps: int) -> list[Frame]:
    """The canvas's token ids, step by step."""
    trajectory_SxC = np.asarray(trajectory_SxC)
    return display.build_frames(trajectory_SxC[None], np.array([steps]), trajectory_SxC[max(steps - 1, 0)][None],
                                lambda t: f"{t} ")
