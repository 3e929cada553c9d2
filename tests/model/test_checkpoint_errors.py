"""Bad checkpoints give one clear line, not a traceback from deep inside."""

import json
import os
import shutil

import pytest

from dgemma.checkpoints import load_hf, save_hf
from dgemma.checkpoints import safetensors_io
from dgemma.config import tiny_moe
from dgemma import model
import jax


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  config = tiny_moe()
  path = str(tmp_path_factory.mktemp("ckpt") / "m")
  save_hf(path, config, model.init_params(config, jax.random.key(0)))
  return path


def _copy(src, tmp_path):
  dst = str(tmp_path / "copy")
  shutil.copytree(src, dst)
  return dst


def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_hf(str(tmp_path / "nope"))


def test_unsupported_architecture(exported, tmp_path):
  path = _copy(exported, tmp_path)
  cfg = json.load(open(os.path.join(path, "config.json")))
  cfg["model_type"] = "llama"
  json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
  with pytest.raises(ValueError, match="unsupported architecture model_type='llama'"):
    load_hf(path)


def test_missing_tensor(exported, tmp_path):
  path = _copy(exported, tmp_path)
  f = safetensors_io.SafetensorsFile(os.path.join(path, "model.safetensors"))
  tensors = {k: f.get(k).copy() for k in f.keys() if k != "model.decoder.layers.1.self_attn.q_proj.weight"}
  del f
  safetensors_io.save(os.path.join(path, "model.safetensors"), tensors)
  with pytest.raises(ValueError, match="missing tensor model.decoder.layers.1.self_attn.q_proj.weight"):
    load_hf(path)


def test_shape_mismatch(exported, tmp_path):
  path = _copy(exported, tmp_path)
  cfg = json.load(open(os.path.join(path, "config.json")))
  cfg["text_config"]["intermediate_size"] = 40
  json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
  with pytest.raises(ValueError, match="does not match the config"):
    load_hf(path)


def test_corrupt_file(exported, tmp_path):
  path = _copy(exported, tmp_path)
  with open(os.path.join(path, "model.safetensors"), "wb") as f:
    f.write(b"\x05\x00\x00\x00\x00\x00\x00\x00garbage")
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    load_hf(path)


def test_truncated_file(exported, tmp_path):
  path = _copy(exported, tmp_path)
  file = os.path.join(path, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 100)
  with pytest.raises(ValueError, match=r"bytes of data, \d+ expected for shape .* \(a truncated or damaged file\)"):
    load_hf(path)


def test_export_over_an_earlier_export(tmp_path):
  """Writing a sharded export where a single-file one was leaves only the new weights to load."""
  config = tiny_moe()
  first, second = (model.init_params(config, jax.random.key(s)) for s in (0, 1))
  path = str(tmp_path / "m")
  save_hf(path, config, first)
  save_hf(path, config, second, max_shard_bytes=20_000)
  assert "model.safetensors" not in os.listdir(path) and "model.safetensors.index.json" in os.listdir(path)
  _, loaded = load_hf(path)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), loaded, second))
  os.remove(os.path.join(path, sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))[0]))
  with pytest.raises(FileNotFoundError, match="model.safetensors.index.json names model-00001-of-"):
    load_hf(path)


@pytest.mark.parametrize("text, message", [
    ("{not json", "generation_config.json: not readable JSON"),
    ('{"eos_token_id": "1"}', "generation_config.json: eos_token_id must be a token id or a list of them"),
])
def test_bad_generation_config(exported, tmp_path, text, message):
  path = _copy(exported, tmp_path)
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    f.write(text)
  with pytest.raises(ValueError, match=message):
    load_hf(path)


def test_export_refuses_a_local_last_layer(tmp_path):
  from dgemma.config import GLOBAL, LOCAL
  config = tiny_moe(num_layers=2, layer_types=(GLOBAL, LOCAL))  # HF would load it with a global last layer
  with pytest.raises(ValueError, match="last layer is always global"):
    save_hf(str(tmp_path / "m"), config, model.init_params(config, jax.random.key(0)))


def test_native_round_trip(tmp_path):
  from dgemma.checkpoints import save_model
  from dgemma.loading import load_model
  config = tiny_moe()
  params = model.init_params(config, jax.random.key(3))
  save_model(str(tmp_path / "native"), config, params, {"task": "demo"})
  config2, params2, meta = load_model(str(tmp_path / "native"))
  assert config2 == config and meta == {"task": "demo"}
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, params2))


def test_load_model_rejects_non_checkpoint(tmp_path):
  from dgemma.loading import load_model
  with pytest.raises(ValueError, match="is not a checkpoint"):
    load_model(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_model(str(tmp_path / "missing"))
