"""The entry points' restart with transparent huge pages (dgemma/cpu/huge_pages.py): the environment it sets, when it
stays out of the way, and that the restarted process really takes memory in huge pages (fewer page faults)."""

import os
import subprocess
import sys

import pytest

from dgemma.cpu import huge_pages

# Restarts itself, then touches 256 MiB in one block from glibc's malloc (as XLA:CPU allocates; numpy would advise
# huge pages by itself) and prints the tunables and the minor page faults it took.
_PROBE = """
import ctypes, os, resource, sys
sys.path.insert(0, {root!r})
from dgemma.cpu import huge_pages
huge_pages.restart_with_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(256 << 20), 1, 256 << 20)
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(os.environ.get("GLIBC_TUNABLES", ""), after - before, sep="|")
"""
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _probe(**env_changes: str | None) -> tuple[str, int]:
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "DGEMMA_HUGE_PAGES")}
  env.update({k: v for k, v in env_changes.items() if v is not None})
  out = subprocess.run([sys.executable, "-c", _PROBE.format(root=_ROOT)], env=env, capture_output=True,
                       text=True, check=True, timeout=120).stdout.strip().splitlines()[-1]
  tunables, faults = out.split("|")
  return tunables, int(faults)


needs_madvise_thp = pytest.mark.skipif(
    not huge_pages.should_restart({}), reason="huge pages cannot help here (not glibc >= 2.35 with THP 'madvise')")


@needs_madvise_thp
def test_restart_adds_the_tunable_and_takes_far_fewer_page_faults():
  tunables, faults = _probe()
  off_tunables, off_faults = _probe(DGEMMA_HUGE_PAGES="0")
  assert tunables == huge_pages.TUNABLE and off_tunables == ""
  # 256 MiB is 65,536 pages of 4 KiB but 128 of 2 MiB; allow for pages the kernel could not give huge.
  assert off_faults >= 60_000
  assert faults < off_faults / 8, (faults, off_faults)


@needs_madvise_thp
def test_restart_keeps_the_users_tunables():
  tunables, _ = _probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2")
  assert tunables == f"glibc.malloc.arena_max=2:{huge_pages.TUNABLE}"


def test_no_restart_when_the_user_chose_or_it_cannot_help(tmp_path):
  assert not huge_pages.should_restart({"DGEMMA_HUGE_PAGES": "0"})
  assert not huge_pages.should_restart({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
  for mode, expected in (("always [madvise] never", "madvise"), ("[always] madvise never", "always"),
                         ("always madvise [never]", "never")):
    (tmp_path / "enabled").write_text(mode + "\n")
    assert huge_pages.thp_mode(str(tmp_path / "enabled")) == expected
  assert huge_pages.thp_mode(str(tmp_path / "missing")) is None
