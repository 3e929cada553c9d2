"""Test-wide settings: fast XLA compiles on CPU (the suite is compile-bound) and a persistent
compilation cache, so repeated runs on one machine skip recompiling unchanged programs."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402  (after XLA_FLAGS)

jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/dgemma/jax-test-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
