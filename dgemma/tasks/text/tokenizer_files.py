"""The text task's tokenizer as a file of the exported model, so that a model directory is self-contained.

Training records `data.tokenizer` by its absolute path; the exported model instead holds a copy, recorded by
its name relative to the model directory (older checkpoints keep their absolute paths, which still load):

- "bytes" (the fixed byte vocabulary) needs no file and stays "bytes";
- a tokenizer.json or SentencePiece .model file (given, or found in a checkpoint directory) is copied as is;
- a Gemma .gguf file is not copied (its weights are hundreds of MB): the tokenizer rebuilt from its vocabulary
  (`dgemma.data.tokenizer.gguf_tokenizer`) is written as tokenizer.json.
"""

from __future__ import annotations

import json
import os
import shutil

from dgemma.checkpoints.native import CONFIG_FILE
from dgemma.data.tokenizer import Tokenizer, gguf_tokenizer
from dgemma.tasks.text import byte_tokenizer
from dgemma.training.checkpointing import RUN_FILE

JSON_NAME = "tokenizer.json"


def save(tokenizer: Tokenizer, directory: str) -> str:
  """Writes `tokenizer`'s file into `directory`; returns how metadata names it (relative, or "bytes")."""
  source = tokenizer.path
  if source == byte_tokenizer.NAME:
    return byte_tokenizer.NAME
  os.makedirs(directory, exist_ok=True)
  if source.endswith(".gguf"):
    name = JSON_NAME
    gguf_tokenizer(source).save(os.path.join(directory, name))
    return name
  name = os.path.basename(source)
  target = os.path.join(directory, name)
  if os.path.abspath(source) != os.path.abspath(target):
    shutil.copyfile(source, target)
  return name


def resolve(spec: str, ckpt_path: str | None) -> str:
  """A recorded tokenizer as a path to load: "bytes" and absolute paths as they are, a relative name inside the
  checkpoint directory `ckpt_path`."""
  if not spec or spec == byte_tokenizer.NAME or os.path.isabs(spec):
    return spec
  if not ckpt_path:
    raise ValueError(f"the checkpoint records its tokenizer as {spec!r}, a file in its directory: pass the "
                     "checkpoint path")
  directory = ckpt_path if os.path.isdir(ckpt_path) else os.path.dirname(ckpt_path)
  return os.path.join(directory, spec)


def recorded_by(checkpoint: str) -> str | None:
  """The tokenizer one of our text checkpoints records (an exported model's dgemma.json, a workdir's run.json),
  as a path to load or "bytes"; None for any other checkpoint (an HF directory or a GGUF file holds its tokenizer
  itself). A byte-level model has no tokenizer file, so its directory alone would not say how to read it."""
  for name in (CONFIG_FILE, RUN_FILE):
    path = os.path.join(checkpoint, name)
    if os.path.isfile(path):
      with open(path) as f:
        recorded = ((json.load(f).get("metadata") or {}).get("task") or {}).get("tokenizer")
      return resolve(recorded, checkpoint) if recorded else None
  return None
