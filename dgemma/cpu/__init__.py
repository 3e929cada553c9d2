"""CPU-specific speed tricks, kept together. Each leaves the numbers unchanged (or, for the token-stats kernel,
within float32 rounding of its XLA reference) and has one switch that turns it off.

Huge pages (`huge_pages.py`)
  train.py, sample.py and the scripts restart themselves once with glibc's `glibc.malloc.hugetlb=1` tunable, so
  that malloc advises transparent huge pages for XLA:CPU's large temporary buffers (fewer page faults). Applies
  only on Linux with glibc >= 2.35 and the kernel's THP mode `madvise`. Off: `DGEMMA_HUGE_PAGES=0`.

Token-stats kernel (`token_stats.py`, `token_stats.cc`)
  The sampler's vocabulary-wide work per denoising step (arg-max, entropy, inverse-CDF draw, the probabilities)
  as one C++ XLA FFI custom call, compiled with the system compiler on first use and cached; its reference and
  fallback is `dgemma.sampling.acceptance.analyse`. Off: `SamplerConfig(token_stats="xla")` (`--token_stats=xla`).

Unrolled threefry (`threefry.py`)
  JAX's threefry2x32 hash lowered for CPU as straight-line code instead of a rolled loop, registered when
  `dgemma.sampling` is imported: the same bits. Off: `DGEMMA_CPU_THREEFRY=0` in the environment.

Submodules are not imported here: each is imported where it is used.
"""
