"""Runs in a subprocess with 8 simulated CPU devices (XLA_FLAGS set by the test): for every mesh given, a
few training steps (train.py's building blocks), the sampler with its parameters sharded on the mesh,
and where the big leaves of the train state live. Prints one `RESULT {json}` line per mesh and saves the
trained parameters to <workdir>/<mesh>.npz; tests/sharding/test_meshes.py reads both.

    python -m tests.sharding.mesh_worker '{"devices": 8, "workdir": ..., "cache_dir": ..., "meshes": [{"data": 8}, ...]}'
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import jax
import numpy as np


def main(spec: dict) -> None:
  import train
  from dgemma import sharding
  from dgemma.sampling import generate
  from tests.sharding import common

  assert jax.device_count() == spec["devices"], jax.devices()
  for mesh_cfg in spec["meshes"]:
    name = "x".join(f"{v}{k}" for k, v in mesh_cfg.items())
    c = common.config(spec["cache_dir"], mesh_cfg)
    losses, (_, params), state = common.run_steps(c)
    np.savez(os.path.join(spec["workdir"], f"{name}.npz"),
             **{jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]})
    # The sampler on this mesh, its parameters sharded by the rules.
    mesh, rules = train.mesh_and_rules(c)
    config = common.model_config(c)
    sample_params = common.sample_params(config)
    on_mesh = sharding.put(sample_params, sharding.tree_shardings(sample_params, mesh, rules))
    prompt, valid = common.prompts()
    out = generate(on_mesh, config, prompt, valid, jax.random.key(7), common.SAMPLER)
    # ... and with the batch split over the batch axes too (generate() itself takes host prompts).
    gen = importlib.import_module("dgemma.sampling.generate")
    # (One key per row, so that the keys split over the batch axes with the prompts.)
    keys = gen.row_keys(jax.random.key(7), prompt.shape[0])
    args, static = gen._prepare(config, common.SAMPLER, prompt, valid, keys, None, None)
    batch = sharding.batch_sharding(mesh, rules, prompt.shape[0])
    args = [None if a is None else jax.device_put(a, batch) for a in args]
    split = gen._generate(on_mesh, *args, **static)
    assert split.tokens.sharding.spec == batch.spec or mesh.size == 1, split.tokens.sharding
    leaves = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
      key = jax.tree_util.keystr(path)
      if any(k in key for k in common.BIG_LEAVES) and ("layer_" not in key or "layer_0" in key):
        leaves[key] = {"shape": list(leaf.shape), "spec": [list(a) if isinstance(a, tuple) else a
                                                           for a in leaf.sharding.spec],
                       "shard": [list(s.data.shape) for s in leaf.addressable_shards]}
    print("RESULT " + json.dumps({"mesh": name, "loss": losses, "tokens": np.asarray(out.tokens).tolist(),
                                  "tokens_batch_split": np.asarray(split.tokens).tolist(), "leaves": leaves}),
          flush=True)


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
