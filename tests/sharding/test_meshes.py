"""Training and sampling on meshes of 8 simulated CPU devices give what one device gives.

One subprocess (8 devices; this process already has JAX with 1 device) runs every mesh: a few training steps
with train.py's building blocks, the sampler with sharded parameters, and a report of where the big leaves
of the train state live. This process runs the same on its one device while the subprocess works.
"""

import json
import subprocess

import jax
import numpy as np
import pytest

from dgemma.sampling import generate
from tests.sharding import common

MESHES = {"8data": {"data": 8}, "2datax4fsdp": {"data": 2, "fsdp": 4},
          "2fsdpx2tensorx2expert": {"fsdp": 2, "tensor": 2, "expert": 2}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("meshes")
  spec = {"devices": 8, "workdir": str(tmp), "cache_dir": str(tmp / "data"), "meshes": list(MESHES.values())}
  worker = subprocess.Popen([common.PYTHON, "-m", "tests.sharding.mesh_worker", json.dumps(spec)], cwd=common.ROOT,
                            env=common.subprocess_env(8), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    # Meanwhile, the same on this process's single device.
    c = common.config(str(tmp / "data_single"))
    losses, (initial, params), _ = common.run_steps(c)
    config = common.model_config(c)
    prompt, valid = common.prompts()
    tokens = np.asarray(generate(common.sample_params(config), config, prompt, valid, jax.random.key(7),
                                 common.SAMPLER).tokens)
    out, err = worker.communicate(timeout=400)
  finally:
    if worker.poll() is None:
      worker.kill()
      worker.communicate()
  assert worker.returncode == 0, err[-4000:]
  results = {}
  for line in out.splitlines():
    if line.startswith("RESULT "):
      record = json.loads(line[len("RESULT "):])
      with np.load(tmp / f"{record['mesh']}.npz") as f:
        record["params"] = dict(f)
      results[record["mesh"]] = record
  assert set(results) == set(MESHES), out[-2000:]
  flat = lambda tree: {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return {"loss": losses, "params": flat(params), "initial": flat(initial), "tokens": tokens}, results


@pytest.mark.parametrize("mesh", list(MESHES))
def test_training_matches_one_device(runs, mesh):
  single, results = runs
  r = results[mesh]
  np.testing.assert_allclose(r["loss"], single["loss"], rtol=2e-6)
  assert set(r["params"]) == set(single["params"])
  for key, value in single["params"].items():
    # Sums run in another order on a mesh: ~1e-7 apart after 3 Adam steps of ~1e-3. A layer scalar's gradient
    # is one sum over everything with much cancellation, which Adam's m/sqrt(v) amplifies (measured 3% of a
    # step, ~3e-5, and that moves with the matmul shapes XLA is given); 10% of one step bounds it.
    atol = 1e-4 if "layer_scalar" in key else 1e-6
    np.testing.assert_allclose(r["params"][key], value, rtol=0, atol=atol, err_msg=key)
  # The steps did move the parameters (by ~lr = 1e-3 each), so agreement to 1e-6 is not vacuous.
  assert max(np.abs(v - single["initial"][k]).max() for k, v in single["params"].items()) > 1e-4


@pytest.mark.parametrize("mesh", list(MESHES))
def test_sampler_tokens_identical(runs, mesh):
  single, results = runs
  assert len(np.unique(single["tokens"])) > 3  # real sampling output, not a constant canvas
  np.testing.assert_array_equal(np.asarray(results[mesh]["tokens"]), single["tokens"])  # sharded params
  np.testing.assert_array_equal(np.asarray(results[mesh]["tokens_batch_split"]), single["tokens"])  # and batch


def test_parameters_and_optimizer_state_are_sharded(runs):
  _, results = runs
  leaves = results["2fsdpx2tensorx2expert"]["leaves"]
  expected = {  # (spec, per-device shard shape, ways split) on 2 fsdp x 2 tensor x 2 expert
      "['embedder']['embedding']": (["tensor", "fsdp"], [32, 16], 4),  # [64, 32]: vocab / 2, embed / 2
      "['layer_0']['attn']['q_proj']": (["fsdp", "tensor"], [16, 2, 8], 4),  # [32, 4, 8]
      "['layer_0']['mlp']['gate']": (["fsdp", "tensor"], [16, 24], 4),  # [32, 48]
      "['layer_0']['moe']['gate_up']": (["expert", "fsdp", "tensor"], [2, 16, 12], 8),  # [4, 32, 24]
      "['layer_0']['moe']['down']": (["expert", "tensor", "fsdp"], [2, 6, 16], 8),  # [4, 12, 32]
  }
  for name, (spec, shard, ways) in expected.items():
    for prefix in (".trainable", ".opt_state[1].mu", ".opt_state[1].nu"):  # Adam's moments mirror the params
      leaf = leaves[prefix + name]
      assert leaf["spec"] == spec, (prefix + name, leaf)
      assert leaf["shard"] == [shard] * 8, (prefix + name, leaf)  # on each of the 8 devices
      assert np.prod(shard) * ways == np.prod(leaf["shape"])  # experts over all 8, the rest over fsdp x tensor
  fsdp = results["2datax4fsdp"]["leaves"][".trainable['layer_0']['moe']['gate_up']"]
  assert fsdp["spec"] == [None, "fsdp"] and fsdp["shard"] == [[4, 8, 24]] * 8  # replicated over data
  data = results["8data"]["leaves"][".trainable['layer_0']['moe']['gate_up']"]
  assert data["spec"] == [] and data["shard"] == [[4, 32, 24]] * 8  # pure data parallel: replicated
