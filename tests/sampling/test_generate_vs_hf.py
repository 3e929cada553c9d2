"""End to end against transformers' `generate` on the same random checkpoint, in a deterministic setting:
near-zero temperature makes every candidate the argmax and every position accepted (entropy 0), and both
sides start every canvas from the same tokens. Tokens, steps and trajectories must then be identical.

That holds only where no argmax is a near-tie: the two sides' logits agree to ~1e-5 in float32, so a top-2 gap of
that size may pick different tokens (seen once: a gap of 7e-5, XLA at optimisation level 0 on an AMD EPYC). The
inputs are chosen so that every gap is far above that, and the test checks it on HF's logits before comparing.

Both sides stop on stability with a loose confidence threshold (CONFIDENCE): at these temperatures the tempered
logits are ~1e6, where one float32 ulp is ~0.1, and XLA:CPU gives the maximum and the exponent's argument values
that differ by a few ulps (seen on an AMD EPYC Zen 4: exp(x_top - max) of 0.9-1.1; where in the compiled program the
rounding differs was not pinned down), so our entropy of a one-hot distribution comes out at |H| <= ~0.03 instead
of 0, which the default 0.005 would turn into a missed stop. At real temperatures (logits ~10-100) that error is ~1e-6. The confidence rule itself is checked against
HF's StableAndConfidentStoppingCriteria in test_pieces_vs_hf.py.
"""

import jax
import numpy as np
import pytest
import torch

from dgemma.checkpoints import load_hf
from dgemma.sampling import SamplerConfig, generate
from tests.hf_reference import random_hf_model

B, P, C = 3, 5, 6  # the reference model's canvas_length is 6
STEPS, MAX_NEW, STOP_IDS = 12, 18, (1, 7)
INPUT_SEED = 6  # the prompts and starting canvases: every top-2 logit gap of a running row is >= 9.8e-4
TIE_MARGIN = 5e-4  # 50x the float32 agreement of the two implementations' logits
CONFIDENCE = 0.5  # far above the entropy error at ~1e6 logits, and every tempered entropy here is ~0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  hf = random_hf_model(seed=1)
  # Smaller weights than the reference's stress-test scale, so that denoising settles and the adaptive stop
  # fires for some rows and canvases (with the full scale the argmax canvas keeps changing).
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if "vision" not in name and ("embed" in name or "proj" in name):
        p.mul_(0.3)
  path = tmp_path_factory.mktemp("hf") / "tiny"
  hf.save_pretrained(path)
  config, params = load_hf(str(path))
  return hf, config, params


def _inputs():
  rng = np.random.default_rng(INPUT_SEED)
  prompt = rng.integers(3, 64, (B, P))
  valid = np.ones((B, P), bool)
  valid[1, 3:] = False  # a right-padded prompt
  prompt[~valid] = 0
  canvases = rng.integers(0, 64, (MAX_NEW // C, B, C))
  return prompt, valid, canvases


def _hf_generate(hf, prompt, valid, canvases):
  """HF generate with our starting canvases; records (canvas, finished rows before the step, argmax after, the
  smallest top-2 gap of each row's raw logits over its positions)."""
  starts, steps = iter(torch.tensor(canvases)), []
  canvas_index = [-1]
  prepare, denoise = hf._prepare_denoiser_inputs, hf._denoising_step

  def prepare_with_our_canvas(**kw):
    canvas_index[0] += 1
    kw["model_kwargs"]["decoder_input_ids"] = next(starts)
    return prepare(**kw)

  def recording_step(**kw):
    finished_before = kw["finished_denoising"].clone().numpy()
    gaps, forward = [], kw["decoder_forward"]

    def recording_forward(**inputs):
      out = forward(**inputs)
      top2 = torch.topk(out.logits.double(), 2, dim=-1).values
      gaps.append((top2[..., 0] - top2[..., 1]).min(-1).values.numpy())
      return out

    out = denoise(**dict(kw, decoder_forward=recording_forward))
    steps.append((canvas_index[0], finished_before, out[1].clone().numpy(), gaps[0]))
    return out

  hf._prepare_denoiser_inputs, hf._denoising_step = prepare_with_our_canvas, recording_step
  try:
    out = hf.generate(torch.tensor(prompt), attention_mask=torch.tensor(valid.astype(np.int64)),
                      max_new_tokens=MAX_NEW, max_denoising_steps=STEPS, t_min=1e-6, t_max=2e-6,
                      confidence_threshold=CONFIDENCE,
                      eos_token_id=list(STOP_IDS), pad_token_id=0)
  finally:
    del hf._prepare_denoiser_inputs, hf._denoising_step
  return out, steps


def test_generate_matches_hf_generate(checkpoint):
  hf, config, params = checkpoint
  assert config.pad_id == 0
  prompt, valid, canvases = _inputs()
  sampler = SamplerConfig(max_denoising_steps=STEPS, t_max=2e-6, t_min=1e-6, confidence_threshold=CONFIDENCE,
                          max_new_tokens=MAX_NEW, stop_ids=STOP_IDS, return_trajectory=True)
  ours = generate(params, config, prompt, valid, jax.random.key(0), sampler,
                  initial_canvases=np.moveaxis(canvases, 0, 1))
  theirs, hf_steps = _hf_generate(hf, prompt, valid, canvases)

  # The case is well posed: no running row's argmax is within float32 noise of a tie.
  n = MAX_NEW // C
  hf_tokens = theirs.sequences[:, P:].numpy()
  is_stop = np.isin(hf_tokens.reshape(B, n, C), STOP_IDS).any(-1)
  done_before = np.concatenate([np.zeros((B, 1), bool), np.cumsum(is_stop, 1)[:, :-1] > 0], axis=1)
  running = [~finished & ~done_before[:, canvas] for canvas, finished, _, _ in hf_steps]  # per HF step, [B]
  smallest = min(gap[active].min() for (*_, gap), active in zip(hf_steps, running) if active.any())
  assert smallest >= TIE_MARGIN, f"ill-posed inputs: an argmax near-tie (top-2 gap {smallest:.1e}); pick others"

  tokens = np.asarray(ours.tokens)
  np.testing.assert_array_equal(tokens, hf_tokens)
  np.testing.assert_allclose(np.asarray(ours.tokens_per_forward), theirs.tokens_per_forward.numpy(), rtol=1e-6)

  # HF's per-row pass count, canvas by canvas: steps taken while the row was neither stopped nor finished.
  hf_counts = np.zeros((B, n), int)
  for (canvas, _, argmax, _), active in zip(hf_steps, running):
    hf_counts[:, canvas] += active
    k = hf_counts[:, canvas] - 1
    for row in np.flatnonzero(active):  # our trajectory holds the same argmax canvas for that step
      np.testing.assert_array_equal(np.asarray(ours.trajectory)[row, canvas, k[row]], argmax[row])
  np.testing.assert_array_equal(np.asarray(ours.steps_per_canvas), hf_counts)

  # The case covers what it is meant to: early stops, a row done before the last canvas, EOS padding.
  ran = hf_counts > 0
  assert (hf_counts[ran] < STEPS).any() and (hf_counts[ran] == STEPS).any()
  assert (~ran).any()
  assert ((tokens == 0) & ~done_before.repeat(C, axis=1)).any()
