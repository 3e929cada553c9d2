"""Test-wide settings: fast XLA compiles on CPU (the suite is compile-bound) and a persistent
compilation cache, so repeated runs on one machine skip recompiling unchanged programs."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Through the environment, so that the scripts the tests run as subprocesses (train.py, sample.py, ...) share the
# cache: most of them compile the same few programs. A JAX_COMPILATION_CACHE_DIR already set is kept.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/dgemma/jax-test-cache"))
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"

import jax  # noqa: E402  (after XLA_FLAGS and the cache settings)

from dgemma.cpu import huge_pages  # noqa: E402

# The entry points restart themselves with huge pages where that helps (dgemma/cpu/huge_pages.py): their subprocesses
# here start with it instead, each sparing a second start-up (every import done twice).
if huge_pages.should_restart():
  os.environ["GLIBC_TUNABLES"] = huge_pages.tunables_with_huge_pages()

assert jax.config.jax_compilation_cache_dir == os.environ["JAX_COMPILATION_CACHE_DIR"]
