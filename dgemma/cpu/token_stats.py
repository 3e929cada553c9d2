"""The sampler's vocabulary-wide work as one CPU kernel (`token_stats.cc`, an XLA FFI custom call), with
`acceptance.analyse` (plain XLA) as its reference and fallback.

The kernel is compiled from source with the system C++ compiler (`$CXX`, else `g++`; `-O3 -march=native`) the
first time a process needs it, and cached in `$DGEMMA_CACHE_DIR` (default `~/.cache/dgemma`) under a key of the
source, the compiler, the jaxlib version and the CPU's features, so that a changed file or a different machine
rebuilds. `SamplerConfig(token_stats=...)` chooses: "auto" (the kernel on a single CPU device where it builds
and the vocabulary is a multiple of 16, with a one-time warning naming the reason if it fails to build), "cpu" (the
kernel or a one-line error), "xla".

Outputs against the reference: the same arg-max; the entropy and the probabilities within float32 rounding (the
kernel's exp is a polynomial after Cody-Waite range reduction, within ~1 ulp); the same sample except where the
uniform lands within rounding of a cumulative-probability boundary (the sums run in another order), which the
tests check against a float64 inverse CDF.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings

import flax.struct
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jaxtyping import Array, Float, Int


IMPLS = ("auto", "cpu", "xla")
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "token_stats.cc")
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
_TARGETS = {None: ("dgemma_token_stats", "DgemmaTokenStats"),
            jnp.dtype(jnp.float32): ("dgemma_token_stats_f32", "DgemmaTokenStatsF32"),
            jnp.dtype(jnp.bfloat16): ("dgemma_token_stats_bf16", "DgemmaTokenStatsBf16")}
LANES = 16


# The contract of both implementations (this kernel and `dgemma.sampling.acceptance.analyse`, which imports it).
@flax.struct.dataclass
class TokenStats:
  """What one step needs from the tempered distribution at each position."""
  argmax: Int[Array, "B C"]  # first arg-max (ties go to the lowest id, as torch.argmax)
  entropy: Float[Array, "B C"]  # nats
  sample: Int[Array, "B C"] | None  # a draw from softmax(logits), when uniforms were given
  probs: Float[Array, "B C V"] | None = None  # softmax(logits), float32, when asked for


def block_size(vocab_size: int) -> int:
  """The divisor of `vocab_size` closest to its square root (512 for 262144, 64 for 4096)."""
  root = math.sqrt(vocab_size)
  divisors = [d for d in range(1, math.isqrt(vocab_size) + 1) if vocab_size % d == 0]
  divisors += [vocab_size // d for d in divisors]
  return min(divisors, key=lambda d: (abs(d - root), d))


class KernelUnavailable(RuntimeError):
  """The CPU kernel could not be built or loaded; the message says why, in one line."""


def cache_dir() -> str:
  return os.environ.get("DGEMMA_CACHE_DIR") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dgemma")


def _cpu_features() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))), "")
  except OSError:
    return platform.processor()


def _compiler() -> list[str]:
  return shlex.split(os.environ.get("CXX") or "g++")  # e.g. CXX="ccache g++"


def _library_path() -> str:
  """Where the kernel compiled from this source, with this compiler, for this machine is cached."""
  compiler = _compiler()
  if not compiler or shutil.which(compiler[0]) is None:
    raise KernelUnavailable(f"no C++ compiler {' '.join(compiler)!r} on PATH (set CXX to one)")
  try:
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
  except (OSError, subprocess.TimeoutExpired) as e:
    raise KernelUnavailable(f"cannot run the C++ compiler {' '.join(compiler)!r}: {e}") from None
  with open(_SOURCE, "rb") as f:
    source = f.read()
  key = hashlib.sha256(b"\0".join(
      [source, " ".join(compiler).encode(), version.encode(), " ".join(_FLAGS).encode(), jaxlib.__version__.encode(),
       _cpu_features().encode()])).hexdigest()[:16]
  return os.path.join(cache_dir(), f"token_stats-{key}.so")


def _build(path: str) -> None:
  """Compiles the kernel to `path` (written under another name and renamed: a concurrent build never reads half)."""
  compiler = _compiler()
  print(f"dgemma: compiling the sampler's CPU kernel with {' '.join(compiler)} (once per machine; cached in "
        f"{cache_dir()})", file=sys.stderr, flush=True)
  try:
    os.makedirs(cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
    os.close(fd)
  except OSError as e:
    raise KernelUnavailable(f"cannot write the kernel cache {cache_dir()} ({e.strerror}); set DGEMMA_CACHE_DIR "
                            f"to a writable directory") from None
  try:
    result = subprocess.run([*compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", _SOURCE, "-o", tmp],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
      lines = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
      raise KernelUnavailable(f"{' '.join(compiler)} failed to compile {os.path.basename(_SOURCE)}: "
                              f"{lines[0].strip() if lines else 'exit status ' + str(result.returncode)}")
    os.replace(tmp, path)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise KernelUnavailable(f"compiling {os.path.basename(_SOURCE)} failed: {e}") from None
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@functools.cache
def _register() -> str | None:
  """Builds, loads and registers the kernel once per process: None, or why it could not (a failed build is not
  retried on every sampler call). A cached library that does not load (say, built against another libstdc++) is
  rebuilt once."""
  try:
    path = _library_path()
    if not os.path.exists(path):
      _build(path)
    try:
      library = ctypes.cdll.LoadLibrary(path)
    except OSError:
      os.remove(path)
      _build(path)
      library = ctypes.cdll.LoadLibrary(path)
    for name, symbol in _TARGETS.values():
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
  except KernelUnavailable as e:
    return str(e)
  except (OSError, AttributeError) as e:  # a library that still does not load: say so in one line
    return f"the compiled kernel did not load: {e}"
  return None


def load() -> None:
  """Builds (if needed), loads and registers the kernel; KernelUnavailable with the reason if it cannot."""
  reason = _register()
  if reason is not None:
    raise KernelUnavailable(reason)


def kernel_block(vocab_size: int) -> int | None:
  """The inverse CDF's first level for the kernel: the reference's block (`block_size`) when it is a
  multiple of 16, else the smallest multiple of 16 above it that divides the vocabulary; None when the vocabulary
  is not a multiple of 16 (the kernel reads whole groups of 16)."""
  if vocab_size % LANES:
    return None
  block = block_size(vocab_size)
  if block % LANES == 0:
    return block
  return next(k for k in range(LANES, vocab_size + 1, LANES) if k >= block and vocab_size % k == 0)


@functools.cache
def _warn_once(reason: str) -> None:
  warnings.warn(f"dgemma: the sampler's CPU kernel is unavailable ({reason}); sampling runs the XLA path "
                f"(token_stats='xla' chooses it without this warning)", RuntimeWarning, stacklevel=3)


def resolve(choice: str, vocab_size: int) -> str:
  """"cpu" or "xla" for a SamplerConfig's `token_stats` choice on the current default backend: "cpu" refuses in one
  line where the kernel cannot run; "auto" then takes XLA, warning once if only the build failed."""
  if choice not in IMPLS:
    raise ValueError(f"token_stats must be one of {IMPLS}, got {choice!r}")
  if choice == "xla":
    return "xla"
  if jax.default_backend() != "cpu":
    unfit = f"it is a CPU kernel, but the default backend is {jax.default_backend()}"
  elif kernel_block(vocab_size) is None:
    unfit = f"it needs a vocabulary that is a multiple of {LANES}, got {vocab_size}"
  elif choice == "auto" and jax.device_count() > 1:  # XLA would gather every row to each device for the call
    unfit = "several devices"
  else:
    unfit = _register()  # None once built and registered, else why not
    if unfit is not None and choice == "auto":
      _warn_once(unfit)
  if unfit is None:
    return "cpu"
  if choice == "cpu":
    raise ValueError(f"token_stats='cpu': {unfit}")
  return "xla"


def token_stats(logits_BxCxV: Float[Array, "B C V"], uniform_BxC: Float[Array, "B C"],
                temperature: float | Array = 1.0, probs_dtype=None) -> TokenStats:
  """`acceptance.analyse(logits, uniform, with_probs=probs_dtype is not None, temperature)` as one kernel call,
  the probabilities (if asked for) written directly in `probs_dtype` (float32 or bfloat16).

  `temperature` is a scalar or broadcastable to [B, C, 1], as for `analyse`."""
  load()
  shape, vocab = logits_BxCxV.shape[:-1], logits_BxCxV.shape[-1]
  block = kernel_block(vocab)
  if block is None:
    raise ValueError(f"the CPU kernel needs a vocabulary that is a multiple of {LANES}, got {vocab}")
  key = None if probs_dtype is None else jnp.dtype(probs_dtype)
  if key not in _TARGETS:
    raise ValueError(f"probs_dtype must be float32, bfloat16 or None, got {probs_dtype}")
  inv_t = 1.0 / jnp.asarray(temperature, jnp.float32)
  inv_t = jnp.broadcast_to(inv_t, shape + (1,))[..., 0]  # a scalar, [B, 1, 1] or [B, C, 1] -> [B, C]
  results = [jax.ShapeDtypeStruct(shape, jnp.int32), jax.ShapeDtypeStruct(shape, jnp.float32),
             jax.ShapeDtypeStruct(shape, jnp.int32)]
  if key is not None:
    results.append(jax.ShapeDtypeStruct(logits_BxCxV.shape, key))
  out = jax.ffi.ffi_call(_TARGETS[key][0], results, vmap_method="broadcast_all")(
      logits_BxCxV.astype(jnp.float32), jnp.broadcast_to(uniform_BxC, shape).astype(jnp.float32), inv_t,
      block=np.int64(block))
  return TokenStats(argmax=out[0], entropy=out[1], sample=out[2],
                               probs=out[3] if key is not None else None)
