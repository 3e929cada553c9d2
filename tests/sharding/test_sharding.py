"""dgemma/sharding.py on its own (this process's one device; bigger meshes as axis sizes): mesh shapes, the
logical axes of every parameter, LoRA and optimizer-state leaf, the rules, errors, and cluster detection."""

import jax
import jax.numpy as jnp
import ml_collections
import optax
import pytest
from jax.sharding import PartitionSpec as P

from dgemma import model, sharding
from dgemma.config import GLOBAL, LOCAL, diffusiongemma_26b_a4b, tiny_moe
from dgemma.training import lora, optimizer, state as state_lib

RULES = sharding.DEFAULT_RULES


def sizes(data=1, fsdp=1, tensor=1, expert=1):
  return {"data": data, "fsdp": fsdp, "tensor": tensor, "expert": expert}


def one_line_error(fn, match):
  with pytest.raises(ValueError, match=match) as e:
    fn()
  assert "\n" not in str(e.value)
  return str(e.value)


def test_mesh_shape_from_config():
  assert sharding.mesh_shape({"data": -1, "fsdp": 1, "tensor": 1, "expert": 1}, 8) == sizes(data=8)
  assert sharding.mesh_shape({"data": 2, "fsdp": -1}, 8) == sizes(data=2, fsdp=4)
  assert sharding.mesh_shape({"fsdp": 2, "tensor": 2, "expert": 2}, 8) == sizes(fsdp=2, tensor=2, expert=2)
  assert sharding.mesh_shape(None, 3) == sizes(data=3)
  one_line_error(lambda: sharding.mesh_shape({"data": 2, "fsdp": 2}, 8), "has 4 devices but there are 8")
  one_line_error(lambda: sharding.mesh_shape({"data": 3, "fsdp": -1}, 8), "not divisible by 3")
  one_line_error(lambda: sharding.mesh_shape({"data": -1, "fsdp": -1}, 8), "only one mesh axis may be -1")
  one_line_error(lambda: sharding.mesh_shape({"pipeline": 2}, 8), "unknown mesh axis 'pipeline'")
  one_line_error(lambda: sharding.mesh_shape({"data": 0}, 8), "config.mesh.data must be a positive integer")


def test_make_mesh_on_this_device():
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1, "expert": 1})
  assert mesh.axis_names == sharding.MESH_AXES and dict(mesh.shape) == sizes(data=jax.device_count())
  # On one device every spec is fully replicated: single-device runs compute exactly what they did before.
  specs = sharding.tree_specs(model.param_shapes(tiny_moe()), mesh, RULES)
  assert set(jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))) == {P()}


@pytest.fixture(scope="module")
def real_shapes():
  """The 26B-A4B parameter tree (shapes only) with 6 of its 30 layers: every kind of leaf, real sizes."""
  config = diffusiongemma_26b_a4b(num_layers=6, layer_types=(LOCAL,) * 5 + (GLOBAL,))
  return model.param_shapes(config)


def test_every_parameter_of_the_real_model_has_logical_axes(real_shapes):
  for path, leaf in jax.tree_util.tree_flatten_with_path(real_shapes)[0]:
    axes = sharding.param_logical_axes(sharding.path_names(path))
    assert axes is not None and len(axes) == leaf.ndim, jax.tree_util.keystr(path)


def test_big_leaves_of_the_real_model_are_split(real_shapes):
  mesh = sizes(data=2, fsdp=4, tensor=2, expert=8)  # 128 devices
  specs = sharding.tree_specs(real_shapes, mesh, RULES)
  get = lambda tree, *keys: tree if not keys else get(tree[keys[0]], *keys[1:])
  expected = {
      ("embedder", "embedding"): P("tensor", "fsdp"),  # [262144, 2816]
      ("layer_0", "attn", "q_proj"): P("fsdp", "tensor"),  # [2816, 16, 256]
      ("layer_0", "attn", "k_proj"): P("fsdp", "tensor"),  # [2816, 8, 256]
      ("layer_5", "attn", "k_proj"): P("fsdp", "tensor"),  # global: [2816, 2, 512]
      ("layer_0", "attn", "o_proj"): P("tensor", None, "fsdp"),  # [16, 256, 2816]
      ("layer_0", "mlp", "gate"): P("fsdp", "tensor"),  # [2816, 2112]
      ("layer_0", "mlp", "down"): P("tensor", "fsdp"),  # [2112, 2816]
      ("layer_0", "moe", "gate_up"): P("expert", "fsdp", "tensor"),  # [128, 2816, 1408]
      ("layer_0", "moe", "down"): P("expert", "tensor", "fsdp"),  # [128, 704, 2816]
      ("layer_0", "moe", "router"): P("fsdp"),  # [2816, 128]: all experts' scores in one place
      ("layer_0", "moe", "per_expert_scale"): P("expert"),
      ("layer_0", "pre_attention_norm", "scale"): P(),
      ("layer_0", "attn", "q_norm", "scale"): P(),
      ("layer_0", "layer_scalar"): P(),
  }
  for keys, spec in expected.items():
    assert get(specs, *keys) == spec, keys
  # Per device: the experts split 64 ways (expert x fsdp x tensor), the other big leaves 8 (fsdp x tensor,
  # replicated over data and expert), small ones replicated: 1/27 of all parameters with 6 layers.
  total = per_device = 0
  for leaf, spec in zip(jax.tree.leaves(real_shapes), jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))):
    ways = 1
    for entry in spec:
      for axis in (entry,) if isinstance(entry, str) else (entry or ()):
        ways *= mesh[axis]
    total += leaf.size
    per_device += leaf.size // ways
  assert 1 / 64 < per_device / total < 1 / 20


def test_a_dimension_the_mesh_does_not_divide_is_a_one_line_error():
  # tiny_moe's global layers have a single KV head: a tensor axis of 2 cannot split it.
  shapes = model.param_shapes(tiny_moe())
  msg = one_line_error(lambda: sharding.tree_specs(shapes, sizes(tensor=2), RULES), "cannot shard")
  assert "['layer_1']['attn']['k_proj'] dimension 1 (kv_heads, size 1)" in msg
  assert "mesh axes ('tensor',)" in msg and "config.sharding_rules" in msg
  # Mapping kv_heads to None (replicated) is the way out.
  rules = tuple(r for r in RULES if r[0] != "kv_heads") + (("kv_heads", None),)
  specs = sharding.tree_specs(shapes, sizes(tensor=2), rules)
  assert specs["layer_1"]["attn"]["k_proj"] == P() and specs["layer_1"]["attn"]["q_proj"] == P(None, "tensor")
  msg = one_line_error(lambda: sharding.batch_spec(sizes(data=2, fsdp=4), RULES, 4), r"cannot shard the batch")
  assert "batch size 4 is not divisible by the 8 shards of mesh axes ('data', 'fsdp')" in msg


def test_rules_first_unused_mesh_axis_wins_and_bad_axes_are_errors():
  rules = (("embed", "fsdp"), ("mlp", "fsdp"), ("mlp", "tensor"))  # mlp falls back to tensor
  assert sharding.logical_to_spec(("embed", "mlp"), (8, 8), sizes(fsdp=2, tensor=2), rules) == P("fsdp", "tensor")
  assert sharding.logical_to_spec(("mlp", "embed"), (8, 8), sizes(fsdp=2, tensor=2), rules) == P("fsdp")
  assert sharding.batch_spec(sizes(data=2, fsdp=2, expert=2), RULES) == P(("data", "fsdp", "expert"))
  assert sharding.batch_spec(sizes(data=4), RULES) == P("data")
  one_line_error(lambda: sharding.check_rules((("embed", "model"),)), "names mesh axis 'model'")


def _small_params():
  """A tree with the model's names and sizes big enough for optax's factored second moments (>= 128)."""
  return {"embedder": {"embedding": jnp.zeros((256, 128))},
          "layer_0": {"attn": {"q_proj": jnp.zeros((128, 4, 32)), "o_proj": jnp.zeros((4, 32, 128)),
                               "q_norm": {"scale": jnp.zeros((32,))}},
                      "mlp": {"gate": jnp.zeros((128, 256)), "down": jnp.zeros((256, 128))},
                      "moe": {"gate_up": jnp.zeros((4, 128, 512)), "router": jnp.zeros((128, 4))}}}


def test_adam_moments_mirror_the_parameters():
  params = _small_params()
  tx = optimizer.make_optimizer(ml_collections.ConfigDict(dict(
      name="adam", learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=1, decay_steps=10, b1=0.9, b2=0.99,
      eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)))
  state = jax.eval_shape(lambda p: state_lib.create(p, tx, 0, jax.random.key(0)), params)
  specs = sharding.tree_specs(state, sizes(fsdp=2, tensor=2, expert=2), RULES)
  assert specs.trainable["layer_0"]["moe"]["gate_up"] == P("expert", "fsdp", "tensor")
  adam = specs.opt_state[1]
  for moment in (adam.mu, adam.nu):
    assert moment == specs.trainable
  assert adam.count == P() and specs.step == P()


def test_factored_second_moments_drop_the_reduced_axis():
  params = _small_params()
  tx = optax.scale_by_factored_rms()
  opt = jax.eval_shape(tx.init, params)
  tree = {"params": params, "opt": opt}
  specs = sharding.tree_specs(tree, sizes(fsdp=2, tensor=2), RULES)["opt"]
  gate = params["layer_0"]["mlp"]["gate"]  # [128 embed, 256 mlp]
  v_row, v_col = opt.v_row["layer_0"]["mlp"]["gate"], opt.v_col["layer_0"]["mlp"]["gate"]
  assert (v_row.shape, v_col.shape) == ((128,), (256,)) and gate.shape == (128, 256)
  assert specs.v_row["layer_0"]["mlp"]["gate"] == P("fsdp")
  assert specs.v_col["layer_0"]["mlp"]["gate"] == P("tensor")
  assert specs.v["layer_0"]["mlp"]["gate"] == P()  # factored: v is a (1,) placeholder
  assert specs.v["layer_0"]["attn"]["q_norm"]["scale"] == P()  # too small to factor: v is the full shape


def test_lora_adapters_and_their_moments():
  params = _small_params()
  adapters = jax.eval_shape(lambda p: lora.init(p, 8, jax.random.key(0)), params)
  opt = jax.eval_shape(optax.adam(1e-3).init, adapters)
  specs = sharding.tree_specs({"lora": adapters, "opt": opt}, sizes(fsdp=2, tensor=2), RULES)
  q = specs["lora"]["layer_0/attn/q_proj"]  # a: [128 embed, 8], b: [8, 4 heads x 32]
  assert q == {"a": P("fsdp"), "b": P(None, "tensor")}
  o = specs["lora"]["layer_0/attn/o_proj"]  # a: [4 heads x 32, 8], b: [8, 128 embed]
  assert o == {"a": P("tensor"), "b": P(None, "fsdp")}
  assert specs["lora"]["layer_0/moe/router"] == {"a": P("fsdp"), "b": P()}
  assert specs["opt"][0].mu == specs["lora"] and specs["opt"][0].nu == specs["lora"]


def test_unknown_parameters_are_replicated():
  assert sharding.logical_axes(("layer_0", "something_new"), (128, 128)) == (None, None)
  assert sharding.logical_axes((), ()) == ()


def test_single_process_data_shard_and_global_batch():
  mesh = sharding.make_mesh()
  assert sharding.data_shard(mesh, RULES, 8) == (0, 1, 8)
  batch = sharding.global_batch({"x": jnp.arange(8 * 3).reshape(8, 3)}, mesh, RULES, 8)
  assert batch["x"].shape == (8, 3) and batch["x"].sharding.spec == P()


def test_cluster_detection_and_no_initialisation_without_one(monkeypatch):
  assert sharding.detect_cluster({}) is None
  assert sharding.detect_cluster({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
  assert sharding.detect_cluster({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}) == "SLURM"
  assert sharding.detect_cluster({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "2"}) == "Open MPI"
  assert sharding.detect_cluster({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) == "JAX_COORDINATOR_ADDRESS"
  assert sharding.detect_cluster({"TPU_WORKER_HOSTNAMES": "a,b"}) == "Cloud TPU"
  called = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: called.append(kw))
  assert not sharding.maybe_initialize_distributed(environ={})
  assert not sharding.maybe_initialize_distributed(num_processes=1, environ={})
  assert not called
  assert sharding.maybe_initialize_distributed("127.0.0.1:1234", 2, 1, environ={})
  assert called == [dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=1,
                         initialization_timeout=300)]
  called.clear()
  assert sharding.maybe_initialize_distributed(
      environ={"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"})
  assert called[0]["num_processes"] == 4 and called[0]["process_id"] == 3
  assert called[0]["coordinator_address"] == "h:1"


def test_train_cli_has_the_multi_process_flags():
  from absl import flags

  import train  # noqa: F401  (defines the flags)
  for flag in ("coordinator_address", "num_processes", "process_id"):
    assert flag in flags.FLAGS, flag
