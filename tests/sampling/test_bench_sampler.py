"""scripts/bench_sampler.py's wake-up counter: the context switches of this process's threads."""

import sys
import threading

import pytest

from tests.script_loader import load_script

bench = load_script("scripts/bench_sampler.py")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_context_switches_count_a_thread_that_sleeps_and_is_woken():
  woken = threading.Event()
  done = threading.Event()
  release = threading.Event()  # the sleeper outlives the count: an ended thread's switches leave /proc

  def sleeper():
    for _ in range(20):  # each wait parks the thread until the main thread wakes it
      woken.wait()
      woken.clear()
      done.set()
    release.wait()

  thread = threading.Thread(target=sleeper)
  thread.start()
  before = bench._context_switches()
  for _ in range(20):
    done.clear()
    woken.set()
    done.wait()
  after = bench._context_switches()
  release.set()
  thread.join()
  # Every round parks at least one of the two threads in a wait that the other one ends.
  assert after - before >= 20


def test_context_switches_are_none_without_proc(monkeypatch):
  def no_proc(path):
    raise FileNotFoundError(path)

  monkeypatch.setattr(bench.os, "listdir", no_proc)
  assert bench._context_switches() is None
