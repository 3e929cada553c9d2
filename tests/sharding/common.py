"""What the mesh tests and their subprocesses share: the training config, prompts and sampler settings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import ml_collections
import numpy as np

import train
from configs import sft_sudoku
from dgemma import sharding
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.tasks.sudoku import digits as sudoku_task
from dgemma.sampling import SamplerConfig
from dgemma.training import config_utils, optimizer, state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two canvases (no stop ids, so both always run): the commit and the per-canvas cache buckets run sharded too.
SAMPLER = SamplerConfig(max_denoising_steps=4, max_new_tokens=162, stop_ids=())
BIG_LEAVES = ("embedding", "q_proj", "mlp']['gate", "moe']['gate_up", "moe']['down")


def config(cache_dir: str, mesh: dict | None = None, steps: int = 3) -> ml_collections.ConfigDict:
  """The debug Sudoku run on a tiny MoE backbone (a local and a global attention layer, dense MLP and 4
  experts; 2 KV heads in every layer so that a tensor axis of 2 divides them), batch 8, `steps` steps."""
  c = sft_sudoku.get_config("size=debug")
  c.data.cache_dir = cache_dir
  c.data.num_train = 64
  c.model_preset = "tiny_moe"
  c.model = ml_collections.ConfigDict(dict(canvas_length=81, stop_ids=(sudoku_task.EOS_ID,), num_layers=2,
                                           layer_types=("local", "global"), global_num_kv_heads=2))
  c.optimizer.lr_multipliers = ml_collections.ConfigDict()  # this backbone has no relation bias to speed up
  c.position_features = ()  # nor position features
  c.batch_size, c.num_train_steps, c.checkpoint_every, c.log_every = 8, steps, steps, 1
  c.optimizer.learning_rate = 1e-3  # the tolerances of test_meshes.py are set for steps of this size
  if mesh is not None:
    c.mesh = ml_collections.ConfigDict(mesh)
  return c


def model_config(c: ml_collections.ConfigDict):
  return config_utils.model_config(c.model_preset, c.model.to_dict())


def run_steps(c: ml_collections.ConfigDict):
  """train.train's steps without its checkpoints, logs and export (the same building blocks): on the mesh
  of `c.mesh` over all devices; returns (losses, initial and final params on the host, final state)."""
  mesh, rules = train.mesh_and_rules(c)
  config, params, _ = train.build_model(c, mesh, rules)
  initial = sharding.to_host(params)
  data_iter = iter(train.build_data(c, config, sharding.data_shard(mesh, rules, c.batch_size))[0])
  tx = optimizer.make_optimizer(c.optimizer)
  state = state_lib.create(params, tx, c.lora_rank, jax.random.key(c.seed + 1), c.optimizer.master_dtype,
                           mesh=mesh, rules=rules)
  step_fn = state_lib.make_train_step(config, ObjectiveConfig.from_config(c.diffusion), tx, c.seed,
                                      jax.tree.map(lambda x: x.sharding, state),
                                      sharding.batch_sharding(mesh, rules, c.batch_size),
                                      grad_accum_steps=c.get("grad_accum_steps", 1))
  losses = []
  for _ in range(c.num_train_steps):
    batch = next(data_iter)
    batch = sharding.global_batch({k: batch[k] for k in ("prompt", "canvas", "canvas_mask")}, mesh, rules,
                                  c.batch_size)
    state, metrics = step_fn(state, batch)
    losses.append(float(metrics["loss"]))
  return losses, (initial, sharding.to_host(state.trainable)), state


def sample_params(config) -> dict:
  """Random parameters with large weights (as tests/sampling): peaked logits, so that tokens do not hinge on
  the last bit of a near-tie."""
  from dgemma import model
  params = model.init_params(config, jax.random.key(0))
  return jax.tree.map(lambda x: np.asarray(x * 6 if x.ndim >= 2 else x), params)


def prompts(batch: int = 8) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  prompt = np.concatenate([np.full((batch, 1), sudoku_task.BOS_ID),
                           sudoku_task.digit_to_id(rng.integers(0, 10, (batch, 81)))], axis=1)
  return prompt.astype(np.int32), np.ones(prompt.shape, bool)


def subprocess_env(num_devices: int) -> dict:
  """The environment of a JAX subprocess with `num_devices` simulated CPU devices, fast compiles and the test
  suite's persistent compilation cache (both as tests/conftest.py sets them for every subprocess)."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={num_devices} "
                      "--xla_backend_optimization_level=0")
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(key, None)
  return env


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


PYTHON = sys.executable


def run_workers(module: str, specs: list[dict], num_devices: int, timeout: float = 300) -> list[tuple[dict, str]]:
  """Runs `python -m module JSON(spec)` once per spec, all at once (one JAX process each, `num_devices` CPU
  devices apiece); every one must exit 0. Returns each process's (RESULT json, stdout)."""
  procs = [subprocess.Popen([PYTHON, "-m", module, json.dumps(spec)], cwd=ROOT, env=subprocess_env(num_devices),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for spec in specs]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=timeout))
  finally:
    for p in procs:  # a process whose peer died waits for it: never leave one behind
      if p.poll() is None:
        p.kill()
        p.communicate()
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-4000:]
  return [(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):]), out)
          for out, _ in outputs]
