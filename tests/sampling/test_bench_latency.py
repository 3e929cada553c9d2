"""scripts/bench_latency.py end to end at tiny shapes: the JSON's fields, and its derived numbers recomputed from
its measured parts. No timing thresholds."""

import json
import math
import statistics

import jax
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from tests.script_loader import load_script

bench = load_script("scripts/bench_latency.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  out = tmp_path_factory.mktemp("latency") / "latency.json"
  assert bench.main(["--tiny", f"--json_out={out}", "--peak_tflops=1", "--peak_gbps=10"]) == 0
  return json.loads(out.read_text())


def test_json_has_every_shape_and_field(result):
  assert result["model"]["preset"] == "tiny_moe"
  assert result["device"]["peak_tflops"] == 1 and result["device"]["peak_gbps"] == 10
  shapes = [(r["batch"], r["prompt_len"]) for r in result["results"]]
  assert shapes == [(1, 8), (1, 16), (2, 8), (2, 16)]
  for r in result["results"]:
    n_canvases = math.ceil(max(result["settings"]["new_tokens"]) / r["canvas"])
    assert len(r["step_s"]) == len(r["ar_token_s"]) == n_canvases and len(r["commit_s"]) == n_canvases - 1
    assert r["canvas_ends"] == [r["prompt_len"] + c * r["canvas"] for c in range(n_canvases)]
    assert all(t > 0 for t in [r["prefill_s"], *r["step_s"], *r["ar_token_s"], *r["commit_s"]])
    assert {(g["new_tokens"], g["steps_per_canvas"]) for g in r["generation"]} == {
        (n, s) for n in result["settings"]["new_tokens"] for s in result["settings"]["steps"]}
    roof = r["roofline"]
    for key in ("ar_fraction_of_hbm", "denoise_fraction_of_peak", "prefill_fraction_of_peak", "ar_kv_bytes"):
      assert roof[key] > 0
  assert result["ar_check"]["seconds"] > 0 and result["ar_check"]["derived_seconds"] > 0


def test_tokens_per_second_are_tokens_over_the_measured_parts(result):
  for r in result["results"]:
    for g in r["generation"]:
      n, s = g["new_tokens"], g["steps_per_canvas"]
      canvases = math.ceil(n / r["canvas"])
      diffusion = r["prefill_s"] + s * sum(r["step_s"][:canvases]) + sum(r["commit_s"][:canvases - 1])
      ar = r["prefill_s"] + (n - 1) * statistics.fmean(r["ar_token_s"][:canvases])
      assert g["diffusion_s"] == pytest.approx(diffusion) and g["ar_s"] == pytest.approx(ar)
      assert g["diffusion_tokens_per_s"] == pytest.approx(n / diffusion)
      assert g["ar_tokens_per_s"] == pytest.approx(n / ar)
      assert g["diffusion_batch_tokens_per_s"] == pytest.approx(r["batch"] * n / diffusion)
      assert g["speedup"] == pytest.approx(ar / diffusion)
    for n, steps in r["crossover_steps"].items():  # equal times there
      n, canvases = int(n), math.ceil(int(n) / r["canvas"])
      diffusion = r["prefill_s"] + steps * sum(r["step_s"][:canvases]) + sum(r["commit_s"][:canvases - 1])
      assert diffusion == pytest.approx(r["prefill_s"] + (n - 1) * statistics.fmean(r["ar_token_s"][:canvases]))
    roof = r["roofline"]
    assert roof["ar_fraction_of_hbm"] == pytest.approx(roof["ar_weight_bytes"] / r["ar_token_s"][0] / 1e10)
    assert roof["denoise_fraction_of_peak"] == pytest.approx(roof["denoise_step_flops"] / r["step_s"][0] / 1e12)


def test_ar_bytes_are_the_routed_weights_of_the_parameter_tree():
  """Independent count from the real parameter tree: projections, GeGLUs, routers, embedding, and top_k / E of
  every expert stack at batch 1 (norm scales and the self-conditioning block are not read by an AR step)."""
  cfg = tiny_moe(num_experts=8, top_k_experts=2)
  tree = jax.tree_util.tree_flatten_with_path(model.param_shapes(cfg))[0]
  total = 0.0
  for path, leaf in tree:
    names = [p.key for p in path]
    size = float(np.prod(leaf.shape))
    in_layer = names[0].startswith("layer_")
    if names[0] == "embedder" or in_layer and (
        names[-1] in ("q_proj", "k_proj", "v_proj", "o_proj", "router") or names[-2] == "mlp"):
      total += size
    elif in_layer and names[-1] in ("gate_up", "down"):
      total += size * cfg.top_k_experts / cfg.num_experts
  assert bench.ar_step_bytes(cfg, 1)["weight_bytes"] == pytest.approx(4 * total)  # float32
  assert bench.distinct_experts(cfg, 1) == 2 and 2 < bench.distinct_experts(cfg, 4) < 8


def test_bad_override_is_one_line_error(capsys):
  assert bench.main(["--tiny", "--override=no_such_field=1"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: bad --override entry 'no_such_field=1'") and "\n" not in err


def test_gpu_check_refuses_an_unknown_argument(tmp_path):
  """scripts/gpu_check.sh (its --dry-run runs every stage at tiny shapes: minutes, so not here)."""
  import subprocess
  from tests.script_loader import ROOT
  done = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(tmp_path / "out"), "5"],
                        capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 2 and done.stderr.strip() == "error: unknown argument 5 (expected --dry-run)"


def test_gpu_text_check_refuses_a_missing_input(tmp_path):
  """scripts/gpu_text_check.sh (its --dry-run trains tiny models and runs every stage: minutes, so not here)."""
  import subprocess
  from tests.script_loader import ROOT
  script = str(ROOT / "scripts/gpu_text_check.sh")
  (tmp_path / "in" / "diffusion").mkdir(parents=True)
  (tmp_path / "in" / "diffusion" / "dgemma.json").write_text("{}")
  done = subprocess.run(["bash", script, str(tmp_path / "out"), str(tmp_path / "in")], capture_output=True,
                        text=True, cwd=ROOT)
  assert done.returncode == 2
  assert done.stderr.strip() == (f"error: {tmp_path / 'in'}/ar/dgemma.json does not exist (IN_DIR holds diffusion/, "
                                 "ar/, test.jsonl)")
  done = subprocess.run(["bash", script, str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 2 and done.stderr.strip().startswith("error: usage: bash scripts/gpu_text_check.sh")
  assert not (tmp_path / "out").exists()  # refused before anything was written
