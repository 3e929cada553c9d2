"""The position-feature table is an array that travels with the weights, not part of the static ModelConfig:
a Sudoku model's config stays small, checkpoints record the table in their metadata, and checkpoints of the older
format (the table inside the model config of dgemma.json) load to the same outputs."""

import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sft_sudoku
from dgemma import model
from dgemma.checkpoints import save_model
from dgemma.loading import load_model
from dgemma.sampling import SamplerConfig, generate
from dgemma.tasks.sudoku import digits
from dgemma.training.config_utils import model_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_sudoku_model_config_holds_no_table():
  c = sft_sudoku.get_config()
  config = model_config(c.model_preset, c.model.to_dict())
  assert config.num_position_features == 4 and config.relation_bias
  fields = dataclasses.asdict(config)
  assert "position_features" not in fields
  # Only scalars and per-layer / stop-id tuples: nothing grows with the number of positions.
  assert all(not isinstance(v, (tuple, list)) or len(v) <= config.num_layers for k, v in fields.items()), fields
  assert len(repr(config)) < 2000
  assert hash(config) == hash(model_config(c.model_preset, c.model.to_dict()))
  # The table lives in the training config, beside the model section.
  assert np.asarray(c.position_features).shape == (163, 4)


def _outputs(path):
  config, params, metadata = load_model(str(path))
  features = metadata["position_features"]
  prompt = jnp.asarray(digits.encode_batch(np.random.default_rng(0).integers(0, 10, (2, 81)),
                                           np.zeros((2, 81), int), 82, 81)["prompt"])
  logits, cache = model.encode(params, config, prompt, model.init_cache(config, 2, 82), position_features=features)
  canvas = jnp.asarray(np.random.default_rng(1).integers(3, 13, (2, 81)), jnp.int32)
  denoised = model.denoise(params, config, canvas, cache, position_features=features)
  tokens = generate(params, config, prompt, None, jax.random.key(0), SamplerConfig(max_denoising_steps=3,
                    canvas_length=81, max_new_tokens=81), position_features=features).tokens
  return config, metadata, [np.asarray(x) for x in (logits, denoised, tokens)]


def test_old_format_checkpoint_loads_to_the_same_outputs(tmp_path):
  """assets/sudoku-small is of the old format. Re-saved, the table moves to the metadata; both load to the same
  config and bit-identical outputs, and the table is the task's cell layout."""
  old = ROOT / "assets/sudoku-small"
  assert "position_features" in json.loads((old / "dgemma.json").read_text())["model"]  # (the old format)
  config, params, metadata = load_model(str(old))
  np.testing.assert_array_equal(metadata["position_features"], digits.cell_position_features())
  save_model(str(tmp_path / "new"), config, params, metadata)
  saved = json.loads((tmp_path / "new" / "dgemma.json").read_text())
  assert "position_features" not in saved["model"] and saved["model"]["num_position_features"] == 4
  assert saved["metadata"]["position_features"] == [list(r) for r in digits.cell_position_features()]
  old_config, _, old_outputs = _outputs(old)
  new_config, _, new_outputs = _outputs(tmp_path / "new")
  assert old_config == new_config
  for a, b in zip(old_outputs, new_outputs):
    np.testing.assert_array_equal(a, b)


def test_a_new_checkpoint_written_in_the_old_format_loads_alike(tmp_path):
  """A model saved now, and the same model with its dgemma.json rewritten as the old code wrote it (the table in
  the model config, no num_position_features): the same outputs."""
  c = sft_sudoku.get_config("size=debug")
  config = model_config(c.model_preset, c.model.to_dict())
  params = model.init_params(config, jax.random.key(3))
  params = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.key(4), x.shape), params)  # bias != 0
  save_model(str(tmp_path / "new"), config, params, {"task": {"name": "sudoku_digits", "prompt_len": 82},
                                                      "position_features": c.position_features})
  shutil.copytree(tmp_path / "new", tmp_path / "old")
  info = json.loads((tmp_path / "old" / "dgemma.json").read_text())
  info["model"]["position_features"] = info["metadata"].pop("position_features")
  del info["model"]["num_position_features"]
  (tmp_path / "old" / "dgemma.json").write_text(json.dumps(info))
  _, _, new_outputs = _outputs(tmp_path / "new")
  _, _, old_outputs = _outputs(tmp_path / "old")
  for a, b in zip(old_outputs, new_outputs):
    np.testing.assert_array_equal(a, b)


def test_missing_or_bad_tables_are_one_line_errors(tmp_path):
  config, params, metadata = load_model(str(ROOT / "assets/sudoku-small"))
  prompt = np.full((1, 82), digits.BOS_ID, np.int32)
  sampler = SamplerConfig(max_denoising_steps=2, canvas_length=81, max_new_tokens=81)
  with pytest.raises(ValueError, match=r"reads an \[L, 4\] position-feature table") as e:
    generate(params, config, prompt, None, jax.random.key(0), sampler)
  assert "\n" not in str(e.value)
  table = np.asarray(metadata["position_features"])
  with pytest.raises(ValueError, match="ids must lie in"):
    generate(params, config, prompt, None, jax.random.key(0), sampler, position_features=table + 40)
  with pytest.raises(ValueError, match=r"integer table \[L, num_position_features=4\]"):
    generate(params, config, prompt, None, jax.random.key(0), sampler, position_features=table[:, :3])
  with pytest.raises(ValueError, match="reads an"):  # a checkpoint of such a model is refused without its table
    save_model(str(tmp_path / "x"), config, params, {})


def test_an_old_run_json_reads_alike():
  """A training workdir's run.json of the old format: load_inference's config and metadata, and the fingerprint
  train.py compares on resume, are those of the current format."""
  from dgemma.checkpoints.native import config_and_metadata, config_to_dict
  from dgemma.training.checkpointing import model_fingerprint
  c = sft_sudoku.get_config("size=debug")
  config = model_config(c.model_preset, c.model.to_dict())
  table = [list(r) for r in c.position_features]
  new = json.loads(json.dumps(config_to_dict(config)))
  old = {**{k: v for k, v in new.items() if k != "num_position_features"}, "position_features": table}
  assert config_and_metadata({"model": old, "metadata": {"task": {}}}) == (config, {"task": {},
                                                                                    "position_features": table})
  assert model_fingerprint(old, {}) == model_fingerprint(new, {"position_features": table})
  shorter = model_fingerprint(new, {"position_features": table[:-1]})
  assert shorter != model_fingerprint(new, {"position_features": table})
