"""Trains a config for a wall-clock budget: as many steps as fit, with the learning-rate schedule fitted to them.

    python scripts/train_for_time.py --config=configs/sft_sudoku.py --workdir=DIR --minutes=6 [--config.key=value ...]

For a fixed lease of machine time (a GPU lent for minutes, a night of CPU). A probe run of `--probe_steps` steps
(in a scratch directory, thrown away; checkpoint saves as configured) measures this machine's step rate and
start-up time (model load and compilation); the real run then gets num_train_steps = what fits in the rest of
the budget, less `--margin`, and optimizer.decay_steps = num_train_steps. The budget counts from this script's
start and covers the probe, the start-ups and the final export; evaluations during training
(config.eval.every) are not in the rate, so turn them off or leave room for them. The run itself is train.py's:
resumable from its checkpoints with train.py and the printed step count.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

import train  # noqa: E402
from dgemma.cpu import huge_pages  # noqa: E402

_MINUTES = flags.DEFINE_float("minutes", None, "Wall-clock budget of the whole script, in minutes.")
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", 100, "Steps of the probe run (even, >= 4); the rate is "
                                   "measured over its second half.")
_MARGIN = flags.DEFINE_float("margin", 0.1, "Share of the remaining time left unplanned, for variation.")
_EXPORT_SECONDS = flags.DEFINE_float("export_seconds", 15.0, "Time kept for the final checkpoint and export.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 0, "At most this many steps, even if more fit (0: no cap).")


def plan_steps(budget_s: float, elapsed_s: float, startup_s: float, steps_per_s: float, margin: float,
               export_s: float, max_steps: int = 0) -> int:
  """Training steps that fit in what is left of the budget after one more start-up and the export (at most
  `max_steps` if > 0)."""
  if not 0 <= margin < 1:
    raise ValueError(f"--margin must be in [0, 1), got {margin}")
  left = budget_s - elapsed_s - startup_s - export_s
  steps = int(left * (1 - margin) * steps_per_s)
  return min(steps, max_steps) if max_steps > 0 else steps


def main(argv):
  del argv
  started = time.time()
  c = train._CONFIG.value
  if c is None:
    raise app.UsageError("--config is required, e.g. --config=configs/sft_sudoku.py")
  if _MINUTES.value is None or _MINUTES.value <= 0:
    raise app.UsageError("--minutes must be a positive number")
  probe_steps = _PROBE_STEPS.value
  if probe_steps < 4 or probe_steps % 2:
    raise app.UsageError(f"--probe_steps={probe_steps} must be even and at least 4: the rate is measured over its "
                         "second half, after compilation")
  workdir = train.workdir_from_flags()
  budget_s = 60 * _MINUTES.value
  try:
    if train.checkpointing.read_run_info(workdir) is not None:
      raise ValueError(f"{workdir} already holds a run; resume it with train.py and its step count, or choose a "
                       "new --workdir")
    # --- Probe: the same config (checkpoint saves included), no evaluations ---------------------------------
    probe = c.copy_and_resolve_references()
    probe.num_train_steps = probe_steps + 1  # the loop stops at probe_steps, before any final save
    probe.log_every = probe_steps // 2  # the last logged interval is the second half: compiled, steady
    if "eval" in probe:
      probe.eval.every = 0
    with tempfile.TemporaryDirectory(prefix="train_for_time_probe_") as probe_dir:
      print(f"Probe: {probe_steps} steps in {probe_dir}", flush=True)
      probe_start = time.time()
      scalars = train.train(probe, probe_dir, stop_at_step=probe_steps)
      probe_s = time.time() - probe_start
    steps_per_s = scalars["examples_per_second"] / c.batch_size
    startup_s = max(0.0, probe_s - probe_steps / steps_per_s)
    steps = plan_steps(budget_s, time.time() - started, startup_s, steps_per_s, _MARGIN.value,
                       _EXPORT_SECONDS.value, _MAX_STEPS.value)
    if steps < 1:
      raise ValueError(f"no time left for training: the probe took {probe_s:.0f} s of the {budget_s:.0f} s budget "
                       f"(start-up {startup_s:.0f} s); give more --minutes")
    warmup = c.optimizer.get("warmup_steps", 0)
    if steps <= warmup:
      raise ValueError(f"the {steps} planned steps are no more than optimizer.warmup_steps={warmup}; give more "
                       "--minutes (or --max_steps) or a shorter warm-up")
    print(f"Probe: {steps_per_s:.2f} steps/s, start-up {startup_s:.0f} s; planned {steps} steps "
          f"(~{steps / steps_per_s / 60:.1f} min) to end within {_MINUTES.value:g} min of the start", flush=True)
    # --- The run -------------------------------------------------------------------------------------------
    c.num_train_steps = steps
    c.optimizer.decay_steps = steps
    with train.WorkdirLock(workdir):  # one run per workdir, as train.py
      train.train(c, workdir)
  except (train.TrainingError, ValueError, FileNotFoundError, train.WorkdirBusy) as e:
    if os.environ.get("DGEMMA_TRACEBACK"):
      raise
    sys.exit(f"train_for_time.py: error: {e}")
  print(f"Done in {(time.time() - started) / 60:.1f} min of the {_MINUTES.value:g}-minute budget ({steps} steps; "
        f"to resume: train.py --config.num_train_steps={steps} --config.optimizer.decay_steps={steps})", flush=True)


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()
  app.run(main, flags_parser=train.parse_flags)
