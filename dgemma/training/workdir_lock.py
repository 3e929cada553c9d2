"""One run per workdir: an advisory `fcntl` lock on `WORKDIR/.lock`, held for the whole run.

The kernel drops the lock when the holding process exits, however it exits (kill -9 included), so a killed run
never leaves a workdir stuck. The file records the holder's pid and host, so that a second run can say who holds
it. On a filesystem shared by several hosts only process 0 takes the lock (`train.py`): the other processes of
the same run write nothing that a second run could clobber before process 0 has refused it.
"""

from __future__ import annotations

import fcntl
import os
import socket

LOCK_FILE = ".lock"


class WorkdirBusy(RuntimeError):
  """Another live process holds the workdir."""


class WorkdirLock:
  """`with WorkdirLock(workdir):` holds the workdir or raises WorkdirBusy naming the holder (pid, host)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd: int | None = None

  def acquire(self) -> "WorkdirLock":
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
      os.close(fd)
      raise WorkdirBusy(f"{os.path.dirname(self.path)} is in use by {holder}: one run per workdir (wait for it, "
                        "stop it, or choose another --workdir)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      os.ftruncate(self._fd, 0)  # (the file stays: removing it would race with a run that just opened it)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
