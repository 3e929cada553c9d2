"""A BPE learned from the data (dgemma/tasks/text/bpe.py, scripts/make_tokenizer.py) and configs/text.py's
`tokenizer=` argument: any text round-trips, the specials keep the byte vocabulary's ids and are matched whole,
learning is deterministic, and a model trained with it samples text through the exported model."""

import json
import re

import numpy as np
import pytest

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.data.tokenizer import load_tokenizer
from dgemma.loading import load_model
from dgemma.tasks.text import bpe, byte_tokenizer, chat, likelihood
from dgemma.training.config_utils import model_config
from tests.script_loader import load_script

CORPUS = [f"def f{i}(x):\n    return x + {i} * x\n" for i in range(40)] + ["for item in items:\n    print(item)\n"] * 8


def test_learned_merges_shorten_the_text_and_any_text_round_trips(tmp_path):
  learned = bpe.train(CORPUS, vocab_size=bpe.BASE_SIZE + 40)
  assert learned.get_vocab_size() <= bpe.BASE_SIZE + 40
  tokenizer_json = tmp_path / "tokenizer.json"
  learned.save(str(tokenizer_json))
  tok = load_tokenizer(str(tokenizer_json))
  text = CORPUS[3]
  assert len(tok.encode(text, add_bos=False)) < len(text.encode()) / 2  # "    return x + " is a few tokens
  unseen = "naïve → 数据 \t\r\n émoji 🙂 \x00 end"  # characters the corpus never had: bytes, no unknown token
  for s in (text, unseen, "", "  leading and trailing  "):
    assert tok.decode(tok.encode(s, add_bos=False)) == s


def test_specials_have_the_byte_vocabularys_ids_and_are_matched_whole(tmp_path):
  path = tmp_path / "tokenizer.json"
  bpe.train(CORPUS, vocab_size=512).save(str(path))
  tok = load_tokenizer(str(path))
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert {name: tok.id_of(name) for name in byte_tokenizer.SPECIAL} == byte_tokenizer.SPECIAL
  assert chat.resolve("auto", tok) == "gemma3"
  ids = tok.encode("a<end_of_turn>b", add_bos=False)
  assert ids.count(byte_tokenizer.SPECIAL["<end_of_turn>"]) == 1 and tok.decode(ids) == "a<end_of_turn>b"


def test_learning_is_deterministic_and_too_small_a_vocabulary_is_refused(tmp_path):
  a, b = (bpe.train(CORPUS, vocab_size=300).to_str() for _ in range(2))
  assert a == b
  with pytest.raises(ValueError, match="leaves no room for merges"):
    bpe.train(CORPUS, vocab_size=bpe.BASE_SIZE)


def test_make_tokenizer_script_reads_the_text_tasks_formats(tmp_path, capsys):
  script = load_script("scripts/make_tokenizer.py")
  rows = tmp_path / "train.jsonl"
  rows.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in zip(CORPUS, CORPUS[1:])))
  chats = tmp_path / "chats.jsonl"
  chats.write_text(json.dumps({"messages": [{"role": "user", "content": CORPUS[0]},
                                            {"role": "assistant", "content": CORPUS[1]}]}) + "\n")
  docs = tmp_path / "docs"
  docs.mkdir()
  (docs / "a.txt").write_text("".join(CORPUS))
  for data in (rows, chats, docs):
    out = tmp_path / f"{data.stem}.json"
    assert script.main(["make_tokenizer.py", f"--data={data}", f"--out={out}", "--vocab_size=288"]) == 0
    assert load_tokenizer(str(out)).vocab_size <= 288
  # The texts are every turn's content, in order: a JSONL and the same texts as documents learn the same merges
  # only if both read all of them (here: the prompts and responses of `rows` cover CORPUS).
  assert re.search(r"wrote .*train\.json: \d+ ids \(\d+ texts, [\d.]+ bytes/token on them\), sha256 [0-9a-f]{64}",
                   capsys.readouterr().out)
  from array_record.python.array_record_module import ArrayRecordWriter
  records = tmp_path / "rows.array_record"
  writer = ArrayRecordWriter(str(records), "group_size:1")
  for line in rows.read_text().splitlines() + ['{"prompt": "p"}']:
    writer.write(line.encode())
  writer.close()
  assert script.main(["make_tokenizer.py", f"--data={records}", f"--out={tmp_path / 'ar.json'}"]) == 1
  assert re.fullmatch(r"error: .*rows\.array_record#47: no string field 'response'.*", capsys.readouterr().err.strip())
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "p"}\n')
  for argv, message in ((["--data=" + str(bad), f"--out={tmp_path / 'x.json'}"], r"bad\.jsonl:1: no string field"),
                        ([f"--data={rows}", f"--out={tmp_path / 'x.json'}", "--vocab_size=10"], "no room for merges"),
                        ([f"--data={rows}", f"--out={tmp_path / 'x.txt'}"], "must end in .json")):
    assert script.main(["make_tokenizer.py", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_config_tokenizer_argument_sizes_the_model_and_a_run_samples_text(tmp_path, capsys):
  path = tmp_path / "tokenizer.json"
  bpe.train(CORPUS, vocab_size=300).save(str(path))
  size = load_tokenizer(str(path)).vocab_size
  data = tmp_path / "toy.jsonl"
  data.write_text("".join(json.dumps({"prompt": f"Say {w}.", "response": f"{w} {w}."}) + "\n"
                          for w in ("hi", "yes", "no", "blue")))
  c = text_config.get_config(f"data={data},size=debug,tokenizer={path}")
  assert c.model.vocab_size == -(-size // 16) * 16 and c.model.vocab_size % 16 == 0 and c.data.tokenizer == str(path)
  with pytest.raises(ValueError, match="brings its own tokenizer"):
    text_config.get_config(f"tokenizer={path},init={tmp_path}")
  train.train(c, str(tmp_path / "run"))
  model_dir = tmp_path / "run" / "model"
  config, _, metadata = load_model(str(model_dir))
  assert metadata["task"]["tokenizer"] == "tokenizer.json" and (model_dir / "tokenizer.json").exists()
  task = tasks.for_checkpoint(config, metadata, str(model_dir))
  assert task.config.stop_ids == (1, 4) and task.chat_template == "gemma3"
  tokens, _ = task.encode(np.array(["Say hi."], dtype=object))
  prompt = tokens[0][tokens[0] != 0]  # (left-padded)
  assert load_tokenizer(str(path)).decode(prompt) == "<bos><start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n"
  capsys.readouterr()
  assert load_script("sample.py").main(["sample.py", f"--ckpt={model_dir}", "--prompt=Say hi.", "--steps=2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == "=== prompt 1/1" and lines[-2].startswith("--- 1 prompt(s) · canvas 16 ·")


def test_held_out_batches_count_the_bytes_of_text_their_tokens_spell(tmp_path):
  """Bits per byte compare tokenizers: each example's byte count is its (stripped, gemma3-templated) response's
  UTF-8 length when it fits, and the first canvas-capacity tokens' text when it is cut; never the specials."""
  path = tmp_path / "tokenizer.json"
  bpe.train(CORPUS, vocab_size=300).save(str(path))
  responses = ["return x + 1 * x", "naïve → 数据 🙂", "  for item in items:\n    print(item)  ", "x" * 500]
  data = tmp_path / "held_out.jsonl"
  data.write_text("".join(json.dumps({"prompt": "p", "response": r}) + "\n" for r in responses))
  c = text_config.get_config(f"data={data},size=debug,tokenizer={path}")
  task = tasks.for_config(c, model_config(c.model_preset, c.model.to_dict()))
  encoder = task.encoder(c)
  (batch,) = likelihood.batches(encoder, batch_size=8)
  tok = load_tokenizer(str(path))
  capacity = c.model.canvas_length * c.data.max_canvases
  cut = tok.decode(tok.encode(responses[3], add_bos=False)[:capacity])
  assert len(tok.encode(responses[3], add_bos=False)) > capacity and 0 < len(cut) < 500
  expected = [len(r.strip().encode("utf-8")) for r in responses[:3]] + [len(cut)]
  assert batch["text_bytes"].tolist() == expected
