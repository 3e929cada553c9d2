"""The task interface: everything train.py, sample.py and the eval scripts need to know about a task.

A task turns its own data into model examples (`prompt` / `canvas` / `canvas_mask` token batches), reads the
model's canvases back into answers, scores them and shows them. The generic code never looks inside: it calls
these methods on the object the registry (`dgemma.tasks`) builds from `config.task.name` when training, or from
the `task` entry of a checkpoint's metadata when sampling. See docs/tasks.md for a complete toy task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:  # (annotations only: the registry stays cheap to import)
  import grain
  import ml_collections
  import numpy as np

  from dgemma.config import ModelConfig
  from dgemma.sampling.display import Frame
  from dgemma.sampling.generate import SamplerConfig

# params -> {"eval/<metric>": value}: the task's held-out scores of one set of weights (train.py adds
# "eval/seconds" and logs them all).
Evaluator = Callable[[dict], dict[str, float]]


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
    """One line summarising an evaluator's scores, e.g. '41.0% of puzzles solved'."""

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
