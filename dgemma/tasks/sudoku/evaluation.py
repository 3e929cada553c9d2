"""Puzzle accuracy during training: a fixed set of held-out Sudoku puzzles solved every `eval.every` steps,
logged as `eval/*` scalars next to the losses (TensorBoard), so a run's accuracy curve comes from its own logs.

The puzzles are generated from `eval.seed`, which must differ from the training data's seed.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from dgemma.sampling import sampler_config, self_conditioning_for
from dgemma.tasks.base import Evaluator
from dgemma.tasks.sudoku import digits, solving
from dgemma.tasks.sudoku import puzzles as sudoku


def make_evaluator(c: ml_collections.ConfigDict, task, metadata: dict) -> Evaluator | None:
  """params -> {"eval/accuracy", "eval/cell_accuracy", "eval/mean_steps"}; None when `eval.every` is 0 or the
  config has no `eval` section. `metadata`: the run's checkpoint metadata (its sampler defaults)."""
  e = c.get("eval")
  if e is None or not e.every:
    return None
  if e.every < 0 or e.num_puzzles < 1:  # (found now, not after the steps before the first evaluation)
    raise ValueError(f"eval.every must be >= 0 and eval.num_puzzles >= 1, got {e.every} and {e.num_puzzles}")
  if e.seed == c.data.seed and not c.data.csv:
    raise ValueError(f"eval.seed={e.seed} equals data.seed: the evaluation puzzles would be training puzzles")
  if jax.process_count() > 1:
    raise ValueError("evaluation during training runs in single-process runs only; set --config.eval.every=0 "
                     "and use scripts/eval_sudoku.py on the saved model")
  data = sudoku.generate_dataset(e.num_puzzles, e.seed, c.data.min_clues, c.data.max_clues)
  puzzles, solutions = np.asarray(data["puzzle"]), np.asarray(data["solution"])
  autoregressive = c.diffusion.diffusion_loss_weight == 0  # a model trained only causally is decoded causally
  sampler = sampler_config(metadata, max_denoising_steps=e.max_steps,  # the run's `sampler` knobs
                           self_conditioning=self_conditioning_for(metadata))

  features = metadata.get("position_features")  # the model's, when it has them

  def evaluate(params: dict) -> dict[str, float]:
    rng = jax.random.key(e.seed)
    if autoregressive:
      result = solving.solve_autoregressive(params, task, puzzles, rng, position_features=features)
    else:
      result = solving.solve(params, task, puzzles, rng, sampler, position_features=features)
    scores = digits.score(puzzles, solutions, result.predictions)
    return {"eval/accuracy": scores["accuracy"], "eval/cell_accuracy": scores["cell_accuracy"],
            "eval/mean_steps": float(np.mean(result.steps))}

  return evaluate


def describe(scores: dict[str, float]) -> str:
  return (f"{scores['eval/accuracy']:.1%} of puzzles solved, {scores['eval/cell_accuracy']:.1%} of blank cells "
          f"right, {scores['eval/mean_steps']:.1f} mean steps")
