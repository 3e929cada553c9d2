"""Scale-out: the device mesh, parameter/optimizer-state shardings by logical axis names, batch sharding, and
multi-process start-up with JAX's own runtime (`jax.distributed`).

    mesh = make_mesh({"data": -1, "fsdp": 1, "tensor": 1, "expert": 1})    # product = all devices
    shardings = tree_shardings(state, mesh, DEFAULT_RULES)                 # params, LoRA, opt state alike
    batch = global_batch(local_numpy_batch, mesh, rules, global_batch_size)

MaxText style: every parameter dimension has a *logical* name (embed, heads, mlp, expert, ...) given by the
parameter's name in the tree (`logical_axes`); the config's rules map logical names to *mesh* axes. The model
code carries no annotations. A leaf of any other tree (LoRA adapters, Adam's mu/nu, factored second moments)
is named after the parameter whose path it mirrors. Activations are sharded by batch only: the train step and
the sampler get their inputs sharded over the "batch" rule and XLA propagates the rest.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")
DEFAULT_MESH = {"data": -1, "fsdp": 1, "tensor": 1, "expert": 1}

# (logical axis, mesh axis or axes). A logical axis may appear several times: the first entry whose mesh axes
# are not yet used by another dimension of the same leaf wins (MaxText's rule). Logical axes without a rule
# (head_dim, norm, positions, router, lora_rank) are replicated. The batch also spans "expert": outside the
# experts, the expert axis is one more data-parallel axis (as in MaxText).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp", "expert")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("vocab", "tensor"),
)

Rules = Sequence[tuple[str, Any]]

# --- The mesh -------------------------------------------------------------------------------------------


def mesh_shape(mesh_config: Mapping[str, int] | None, num_devices: int) -> dict[str, int]:
  """{axis: size} for all four axes, in MESH_AXES order; one axis may be -1 ("the rest")."""
  cfg = dict(DEFAULT_MESH if mesh_config is None else mesh_config)
  unknown = sorted(set(cfg) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"unknown mesh axis {unknown[0]!r} in config.mesh; the axes are {list(MESH_AXES)}")
  sizes = {axis: cfg.get(axis, 1) for axis in MESH_AXES}
  for axis, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
      raise ValueError(f"config.mesh.{axis} must be a positive integer or -1 (the rest), got {size!r}")
  rest = [axis for axis, size in sizes.items() if size == -1]
  if len(rest) > 1:
    raise ValueError(f"only one mesh axis may be -1, got {rest}")
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if rest:
    if num_devices % fixed:
      raise ValueError(f"config.mesh {_fmt(sizes)} does not fit {num_devices} devices: {num_devices} is not "
                       f"divisible by {fixed}")
    sizes[rest[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(f"config.mesh {_fmt(sizes)} has {fixed} devices but there are {num_devices}; set one axis "
                     "to -1 to take the rest")
  return {axis: int(size) for axis, size in sizes.items()}


def make_mesh(mesh_config: Mapping[str, int] | None = None, devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh with axes (data, fsdp, tensor, expert) over all devices of all processes (or `devices`).

  The first axes are the outermost: with several hosts, data (then fsdp) crosses hosts and tensor/expert stay
  inside one, where the interconnect is fast. Axes are of type Auto: XLA propagates shardings (GSPMD).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = mesh_shape(mesh_config, len(devices))
  return jax.make_mesh(tuple(sizes.values()), MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES), devices=devices)


def _fmt(sizes: Mapping[str, int]) -> str:
  return "(" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"


# --- Logical axes of parameters ---------------------------------------------------------------------------

_ATTENTION = {
    "q_proj": ("embed", "heads", "head_dim"),
    "k_proj": ("embed", "kv_heads", "head_dim"),
    "v_proj": ("embed", "kv_heads", "head_dim"),
    "o_proj": ("heads", "head_dim", "embed"),
}
_DENSE_MLP = {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}
_MOE = {
    "gate_up": ("expert", "embed", "mlp"),  # [E, D, 2F]: [gate | up] along the last axis
    "down": ("expert", "mlp", "embed"),  # [E, F, D]
    "router": ("embed", "router"),  # [D, E]: the router's experts axis stays whole (top-k needs them all)
    "router_scale": ("norm",),
    "per_expert_scale": ("expert",),
}
_EMBEDDER = {"embedding": ("vocab", "embed"), "positions": ("positions", "embed")}
# How many leading axes of a LoRA-adapted weight are its input (lora.py flattens [in..., out...]).
_LORA_INPUT_RANK = {"o_proj": 2}


def param_logical_axes(names: Sequence[str]) -> tuple[str | None, ...] | None:
  """Logical axes of the model parameter at `names` (e.g. ('layer_3', 'attn', 'q_proj')); None if unknown."""
  if not names:
    return None
  *parents, name = names
  parent = parents[-1] if parents else ""
  if name == "scale":  # RMSNorm scales: per head dim inside attention, per width elsewhere
    return ("head_dim",) if parent in ("q_norm", "k_norm") else ("norm",)
  if parent == "attn" and name in _ATTENTION:
    return _ATTENTION[name]
  if parent == "mlp" and name in _DENSE_MLP:
    return _DENSE_MLP[name]
  if parent == "moe" and name in _MOE:
    return _MOE[name]
  if parent == "embedder" and name in _EMBEDDER:
    return _EMBEDDER[name]
  if name == "layer_scalar":
    return (None,)
  return None


def _lora_logical_axes(names: Sequence[str]) -> tuple[str | None, ...] | None:
  """LoRA adapters {'layer_0/attn/q_proj': {'a': [in, r], 'b': [r, out]}}: the flattened in/out dimension
  takes the logical name of the weight's first input/output axis (a block split of the flattened dimension
  is a split of that axis whenever the axis divides)."""
  if len(names) < 2 or names[-1] not in ("a", "b"):
    return None
  target = [n for part in names[:-1] for n in part.split("/")]
  axes = param_logical_axes(target)
  if axes is None or len(target) < 2 or target[-2] not in ("attn", "mlp", "moe"):
    return None
  k = _LORA_INPUT_RANK.get(target[-1], 1)
  return (axes[0], "lora_rank") if names[-1] == "a" else ("lora_rank", axes[k])


def logical_axes(names: Sequence[str], shape: Sequence[int],
                 full_shape: Sequence[int] | None = None) -> tuple[str | None, ...]:
  """Logical axes of a leaf of params, LoRA params or optimizer state, from the dict keys on its path.

  A leaf shaped like its parameter takes the parameter's axes; one with a single axis less (factored second
  moments: the parameter's shape `full_shape` with one axis reduced away) takes the axes that remain; any
  other leaf (step counters, placeholders, unknown names) is replicated.
  """
  names = tuple(names)
  axes = _lora_logical_axes(names) or param_logical_axes(names)
  shape = tuple(shape)
  if axes is None or not shape:
    return (None,) * len(shape)
  if len(axes) == len(shape):
    return axes
  if full_shape is not None and len(full_shape) == len(axes) == len(shape) + 1:
    for drop in range(len(axes)):
      if tuple(full_shape[:drop]) + tuple(full_shape[drop + 1:]) == shape:
        return axes[:drop] + axes[drop + 1:]
  return (None,) * len(shape)


def path_names(path: Iterable[Any]) -> tuple[str, ...]:
  """The dict keys of a pytree key path: the parameter path that params, LoRA params and optimizer state
  (whose mu/nu/... mirror the parameter tree below namedtuple fields and list indices) have in common."""
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def tree_logical_axes(tree: Any) -> list[tuple[str | None, ...]]:
  """The logical axes (a tuple per leaf, in `jax.tree.leaves` order) of every leaf of `tree`."""
  leaves = [(path_names(p), np.shape(leaf)) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
  full_shapes: dict[tuple[str, ...], tuple[int, ...]] = {}
  for names, shape in leaves:  # the full-rank shape of each parameter path, for factored statistics
    axes = _lora_logical_axes(names) or param_logical_axes(names)
    if axes is not None and len(axes) == len(shape):
      full_shapes.setdefault(names, shape)

  def full_shape(names):  # the same path, or the one sharing the longest tail with it (other prefixes)
    if names in full_shapes:
      return full_shapes[names]
    best, best_len = None, 1
    for key, shape in full_shapes.items():
      n = 0
      while n < min(len(key), len(names)) and key[-1 - n] == names[-1 - n]:
        n += 1
      if n > best_len:
        best, best_len = shape, n
    return best

  out = []
  for names, shape in leaves:
    axes = logical_axes(names, shape)
    if shape and all(a is None for a in axes):  # maybe a reduced statistic of a parameter
      axes = logical_axes(names, shape, full_shape(names))
    out.append(axes)
  return out


# --- Logical axes -> mesh axes -----------------------------------------------------------------------------


def check_rules(rules: Rules) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """Normalised rules: ((logical, (mesh axes...)), ...); an unknown mesh axis is a one-line error."""
  out = []
  for rule in rules:
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"a sharding rule is (logical_axis, mesh_axis or (mesh_axes...) or None), got {rule!r}")
    logical, target = rule
    axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    for axis in axes:
      if axis not in MESH_AXES:
        raise ValueError(f"sharding rule {logical!r} names mesh axis {axis!r}; the axes are {list(MESH_AXES)}")
    out.append((logical, axes))
  return tuple(out)


def _mesh_sizes(mesh: Mesh | jax.sharding.AbstractMesh | Mapping[str, int]) -> dict[str, int]:
  return dict(mesh) if isinstance(mesh, Mapping) else dict(mesh.shape)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh, rules: Rules,
                    leaf: str = "array") -> PartitionSpec:
  """The PartitionSpec of an array with these logical axes. Mesh axes of size 1 are left out (a 1-device
  mesh gives fully replicated specs); a dimension its mesh axes do not divide is a one-line error."""
  sizes = _mesh_sizes(mesh)
  rules = check_rules(rules)
  used: set[str] = set()
  spec: list[Any] = []
  for dim, (logical, size) in enumerate(zip(axes, shape)):
    chosen: tuple[str, ...] = ()
    if logical is not None:
      for name, mesh_axes in rules:
        if name == logical and not used.intersection(mesh_axes):
          chosen = mesh_axes
          break
    used.update(chosen)
    chosen = tuple(a for a in chosen if sizes.get(a, 1) > 1)
    ways = math.prod(sizes[a] for a in chosen)
    if size % ways:
      raise ValueError(
          f"cannot shard {leaf} dimension {dim} ({logical}, size {size}) over mesh axes {chosen} ({ways} shards): "
          f"not divisible; change config.mesh or map {logical!r} to None in config.sharding_rules")
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec)


def tree_specs(tree: Any, mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """PartitionSpecs for every leaf of a params / LoRA / optimizer-state / TrainState tree."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  axes = tree_logical_axes(tree)
  specs = [logical_to_spec(a, np.shape(leaf), mesh, rules, jax.tree_util.keystr(path) or "array")
           for (path, leaf), a in zip(leaves, axes)]
  return jax.tree_util.tree_unflatten(treedef, specs)


def tree_shardings(tree: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs)."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), tree_specs(tree, mesh, rules),
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def abstract(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying shardings: the target of a sharded checkpoint restore."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)


def put(tree: Any, shardings: Any) -> Any:
  """Host (numpy) leaves, the same on every process, onto their shardings: each process transfers only the
  shards its own devices hold (`jax.make_array_from_callback`, which works across processes)."""
  def one(x, s):
    if isinstance(x, jax.Array) and (s.is_fully_addressable or not x.is_fully_addressable):
      return jax.device_put(x, s)
    x = np.asarray(x)  # e.g. a checkpoint loaded onto this process's first device, for a multi-process mesh
    return jax.make_array_from_callback(x.shape, s, lambda index: x[index])
  return jax.tree.map(one, tree, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


# --- The batch ------------------------------------------------------------------------------------------------


def batch_spec(mesh, rules: Rules = DEFAULT_RULES, batch_size: int | None = None) -> PartitionSpec:
  """The PartitionSpec of activations and inputs: the leading (batch) axis over the "batch" rule's axes."""
  spec = logical_to_spec(("batch",), (0,), mesh, rules, "the batch")
  axes = () if not len(spec) else (spec[0],) if isinstance(spec[0], str) else tuple(spec[0])
  shards = math.prod(_mesh_sizes(mesh)[a] for a in axes)
  if batch_size is not None and batch_size % shards:
    raise ValueError(f"cannot shard the batch: batch size {batch_size} is not divisible by the {shards} shards of "
                     f"mesh axes {axes}; change config.batch_size or config.mesh")
  return spec


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES, batch_size: int | None = None) -> NamedSharding:
  return NamedSharding(mesh, batch_spec(mesh, rules, batch_size))


def data_shard(mesh: Mesh, rules: Rules, global_batch_size: int) -> tuple[int, int, int]:
  """(shard_index, shard_count, local_batch_size) of this process's part of the input pipeline.

  The rows of a global batch that this process's devices hold form one contiguous block; processes holding
  the same block (the batch is replicated across them) read the same shard. One process: (0, 1, batch).
  """
  sharding = batch_sharding(mesh, rules, global_batch_size)
  blocks: dict[int, set[tuple[int, int]]] = {}
  for device, index in sharding.devices_indices_map((global_batch_size,)).items():
    start, stop, _ = index[0].indices(global_batch_size)
    blocks.setdefault(device.process_index, set()).add((start, stop))
  ranges = {}
  for process, parts in blocks.items():
    parts = sorted(parts)
    if any(a[1] != b[0] for a, b in zip(parts, parts[1:])):
      raise ValueError(f"process {process} holds non-contiguous rows {parts} of the batch; order the mesh so "
                       "that each process's devices hold one block")
    ranges[process] = (parts[0][0], parts[-1][1])
  distinct = sorted(set(ranges.values()))
  if any(a[1] != b[0] or a[1] - a[0] != b[1] - b[0] for a, b in zip(distinct, distinct[1:])):
    raise ValueError(f"the processes hold overlapping or uneven blocks {distinct} of the batch; order the mesh so "
                     "that they split it evenly")
  mine = ranges[jax.process_index()]
  return distinct.index(mine), len(distinct), mine[1] - mine[0]


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh, rules: Rules, global_batch_size: int) -> dict:
  """One global jax.Array per entry from this process's rows (`data_shard`), sharded over the batch axes."""
  sharding = batch_sharding(mesh, rules, global_batch_size)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), (global_batch_size, *np.shape(v)[1:]))
          for k, v in local.items()}


def to_host(tree: Any) -> Any:
  """Every leaf as a numpy array on every process (sharded leaves are gathered one at a time, so device
  memory never holds more than one extra full leaf). All processes must call it."""
  from jax.experimental import multihost_utils

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
      return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(one, tree)


# --- Multi-process start-up ---------------------------------------------------------------------------------

# Environments in which a launcher started one process per host/GPU: jax.distributed.initialize() reads
# the coordinator, the process count and the process id from them by itself.
_CLUSTER_ENVS = (
    ("SLURM", ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID"), "SLURM_NTASKS"),
    ("Open MPI", ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"),
)


def detect_cluster(environ: Mapping[str, str] | None = None) -> str | None:
  """The name of the multi-process launcher this process runs under, or None (a plain single process)."""
  env = os.environ if environ is None else environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  for name, required, count in _CLUSTER_ENVS:
    if all(k in env for k in required) and _int(env.get(count)) > 1:
      return name
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  if hosts and len([h for h in hosts.split(",") if h]) > 1:
    return "Cloud TPU"
  return None


def _int(value: str | None) -> int:
  try:
    return int(re.sub(r"\(.*\)", "", value or "0"))
  except ValueError:
    return 0


def maybe_initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                                 process_id: int | None = None, *, initialization_timeout: int = 300,
                                 environ: Mapping[str, str] | None = None) -> bool:
  """Calls `jax.distributed.initialize` when flags are given or a cluster launcher is detected; True if this
  is (now) a multi-controller run. Must run before anything touches a JAX device.

  Flags win; missing values come from the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
  JAX_PROCESS_ID, or what jax detects under SLURM / Open MPI / Cloud TPU). On CPU the cross-process
  collectives are gloo over TCP.
  """
  env = os.environ if environ is None else environ
  if jax.distributed.is_initialized():
    return True
  coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else (
      _int(env["JAX_NUM_PROCESSES"]) if env.get("JAX_NUM_PROCESSES") else None)
  process_id = process_id if process_id is not None else (
      _int(env["JAX_PROCESS_ID"]) if env.get("JAX_PROCESS_ID") else None)
  if coordinator_address is None and num_processes is None and process_id is None and not detect_cluster(env):
    return False
  if num_processes == 1 and not coordinator_address:
    return False
  if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:  # older jax had none by default
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=initialization_timeout)
  return True
