"""Transparent huge pages for XLA:CPU's buffers: the entry points restart themselves with glibc's malloc tunable.

XLA:CPU allocates a program's temporaries afresh on every run, in blocks too large for glibc's heaps, so each
training step maps new memory that the kernel faults in 4 KiB at a time, and page faults take a large share of
the step. `glibc.malloc.hugetlb=1` makes malloc advise transparent huge pages on what it maps (2 MiB per fault):
far fewer faults, the same numbers (only where memory comes from changes). Measurements: docs/performance.md.

glibc reads its tunables only when a process starts, hence the restart (`os.execv`, same PID, same arguments).
Nothing is done where it cannot help: not Linux with glibc >= 2.35, the kernel's THP mode is not `madvise`
(`always` already gives huge pages, `never` gives none), GLIBC_TUNABLES already names a hugetlb setting, or
DGEMMA_HUGE_PAGES=0.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), or None where it has none."""
  try:
    with open(path) as f:
      words = f.read().split()
  except OSError:
    return None
  chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
  return chosen[0] if chosen else None


def should_restart(environ=os.environ) -> bool:
  """Whether restarting with TUNABLE would change how this process's memory is paged."""
  if environ.get("DGEMMA_HUGE_PAGES") == "0" or "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
    return False
  if not sys.platform.startswith("linux"):
    return False
  libc, version = platform.libc_ver()
  try:
    new_enough = tuple(int(part) for part in version.split(".")[:2]) >= (2, 35)  # the tunable's first release
  except ValueError:
    new_enough = False
  return libc == "glibc" and new_enough and thp_mode() == "madvise"


def tunables_with_huge_pages(environ=os.environ) -> str:
  """GLIBC_TUNABLES with TUNABLE added: what the restart sets (a parent can set it up front, sparing its children
  the restart)."""
  previous = environ.get("GLIBC_TUNABLES", "")
  return f"{previous}:{TUNABLE}" if previous else TUNABLE


def restart_with_huge_pages() -> None:
  """Re-executes the running command with TUNABLE added to GLIBC_TUNABLES; returns only if nothing is to be done."""
  if not should_restart():
    return
  os.environ["GLIBC_TUNABLES"] = tunables_with_huge_pages()
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
