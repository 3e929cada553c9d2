"""Every process's data-iterator state in a checkpoint (dgemma/training/data_state.py), on this one process; the
two-process run is tests/sharding/test_text_resume.py."""

import json

import pytest

from dgemma.training import data_state

A = {"next_index": 12, "parent": {"epoch": 1}}
B = {"next_index": 15, "parent": {"epoch": 1}}


def test_one_process_saves_its_state_and_reads_it_back_through_json():
  saved = json.loads(json.dumps(data_state.gather(A)))  # (as the checkpoint's JSON item holds it)
  assert saved == {"per_process": [A]}
  assert data_state.this_process(saved, "ckpt/3") == A


def test_an_older_checkpoint_holds_one_state_for_every_process():
  assert data_state.this_process(A, "ckpt/3") == A


def test_another_process_count_takes_a_position_all_processes_shared():
  assert data_state.this_process({"per_process": [A, A]}, "ckpt/3") == A


def test_another_process_count_is_refused_when_positions_differ():
  with pytest.raises(ValueError, match=r"^checkpoint ckpt/3 was written by 2 processes whose data iterators stand "
                                       r"at different positions .* cannot resume on 1: resume it with 2 processes"):
    data_state.this_process({"per_process": [A, B]}, "ckpt/3")
