"""One process of a multi-process (multi-controller) training run on localhost, started by
tests/sharding/test_multiprocess.py: jax.distributed over 127.0.0.1 with gloo CPU collectives, then
train.train on a mesh that spans both processes. Prints one `RESULT {json}` line.

    python -m tests.sharding.process_worker '{"port": ..., "num_processes": 2, "process_id": 0, ...}'
"""

from __future__ import annotations

import json
import sys


def main(spec: dict) -> None:
  from dgemma import sharding
  assert sharding.maybe_initialize_distributed(f"127.0.0.1:{spec['port']}", spec["num_processes"],
                                               spec["process_id"], initialization_timeout=60)
  import jax

  import train
  from tests.sharding import common

  c = common.config(spec["cache_dir"], spec["mesh"], steps=spec["steps"])
  scalars = train.train(c, spec["workdir"])
  print("RESULT " + json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                                "devices": jax.device_count(), "local_devices": jax.local_device_count(),
                                "data_shard": list(sharding.data_shard(*train.mesh_and_rules(c), c.batch_size)),
                                "scalars": scalars}), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
