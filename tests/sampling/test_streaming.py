"""--stream: the host callback from the compiled loop. Absent from the default program; when given, it sees every
step's argmax canvas (checked against the trajectory the sampler returns) and the samples do not change."""

import io

import jax
import numpy as np
import pytest

from dgemma import model
from dgemma.config import GLOBAL, LOCAL, tiny_moe
from dgemma.sampling import SamplerConfig, generate
from dgemma.sampling.generate import _generate, _prepare
from dgemma.sampling.streaming import LiveCanvas

SAMPLER = SamplerConfig(max_denoising_steps=10, max_new_tokens=24, t_max=0.03, t_min=0.015, return_trajectory=True)


@pytest.fixture(scope="module")
def tiny():
  config = tiny_moe(num_layers=2, layer_types=(LOCAL, GLOBAL), stop_ids=(1,))
  params = model.init_params(config, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, params)  # rows stop after different step counts
  prompt = np.random.default_rng(0).integers(3, 64, (4, 6))
  return config, params, prompt


def _program_text(config, params, prompt, on_step):
  args, static = _prepare(config, SAMPLER, prompt, None, jax.random.key(3), None, None, on_step=on_step)
  return _generate.lower(params, *args, **static).as_text()


def test_the_default_program_has_no_callback(tiny):
  config, params, prompt = tiny
  assert "callback" not in _program_text(config, params, prompt, None)
  assert "callback" in _program_text(config, params, prompt, lambda *a: None)


def test_the_callback_sees_every_step_and_the_samples_do_not_change(tiny):
  config, params, prompt = tiny
  seen = []
  plain = generate(params, config, prompt, None, jax.random.key(3), SAMPLER)
  streamed = generate(params, config, prompt, None, jax.random.key(3), SAMPLER,
                      on_step=lambda i, s, a, f: seen.append((int(i), int(s), np.array(a), np.array(f))))
  for field in ("tokens", "steps_per_canvas", "trajectory"):
    np.testing.assert_array_equal(np.asarray(getattr(streamed, field)), np.asarray(getattr(plain, field)))
  trajectory, steps = np.asarray(plain.trajectory), np.asarray(plain.steps_per_canvas)
  # One call per step of the batch's loop, in order: canvas by canvas, steps 0 .. (the slowest row's) - 1.
  expected = [(i, s) for i in range(steps.shape[1]) for s in range(steps[:, i].max())]
  assert [(i, s) for i, s, _, _ in seen] == expected
  assert len(set(steps.ravel().tolist())) > 2  # rows stopped at different steps, so frozen rows are exercised
  for i, s, argmax, ran in seen:
    np.testing.assert_array_equal(ran, s < steps[:, i])  # the rows that ran this step
    np.testing.assert_array_equal(argmax[ran], trajectory[ran, i, s])


def test_live_canvas_redraws_the_watched_row_until_its_final_text(tiny):
  config, params, prompt = tiny
  out = io.StringIO()
  row = 2
  live = LiveCanvas(lambda t: f"{t} ", num_canvases=3, max_steps=10, row=row, stream=out, animate=False)
  result = generate(params, config, prompt, None, jax.random.key(3), SAMPLER, on_step=live)
  trajectory, steps = np.asarray(result.trajectory)[row], np.asarray(result.steps_per_canvas)[row]
  assert live.frames == steps.sum()  # one frame per step the row ran, none while it waited for the others
  last_argmax = [trajectory[i, steps[i] - 1] for i in range(3) if steps[i]]
  final = out.getvalue().split("--- ")[-1].splitlines()
  assert final[0] == f"canvas {len(last_argmax)}/3 · step {steps[len(last_argmax) - 1]}/10"
  assert final[1].replace("[", "").replace("]", "") == "".join(f"{t} " for c in last_argmax for t in c)
  silent = io.StringIO()
  live = LiveCanvas(str, 3, 10, row=None, stream=silent)
  generate(params, config, prompt, None, jax.random.key(3), SAMPLER, on_step=live)
  assert silent.getvalue() == "" and live.frames == 0
