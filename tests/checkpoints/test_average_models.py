"""scripts/average_models.py: the uniform average of several checkpoints of one model, leaf by leaf."""

import dataclasses

import jax
import numpy as np

from dgemma import checkpoints, loading, model
from dgemma.config import tiny_moe
from tests.script_loader import load_script

CONFIG = tiny_moe()


def _save(path, seed, config=CONFIG, task="demo"):
  params = model.init_params(config, jax.random.key(seed))
  checkpoints.save_model(str(path), config, params, {"task": {"name": task}})
  return params


def test_average_is_the_leafwise_mean(tmp_path, capsys):
  runs = [_save(tmp_path / f"m{i}", seed=i, task=f"t{i}") for i in range(3)]
  script = load_script("scripts/average_models.py")
  paths = ",".join(str(tmp_path / f"m{i}") for i in range(3))
  assert script.main(["average_models.py", f"--ckpt={paths}", f"--out={tmp_path / 'avg'}"]) == 0
  config, got, metadata = loading.load_model(str(tmp_path / "avg"))  # checks shapes against the config
  assert config == CONFIG
  assert metadata["task"] == {"name": "t0"} and len(metadata["averaged_from"]) == 3
  flat_got = checkpoints.native.flatten(got)
  flats = [checkpoints.native.flatten(p) for p in runs]
  assert flat_got.keys() == flats[0].keys()
  for key, value in flat_got.items():
    terms = [np.asarray(flat[key], np.float64) for flat in flats]
    want = (terms[0] + terms[1] + terms[2]) / 3
    assert value.dtype == flats[0][key].dtype
    # float32 sums: each addition rounds by up to half an ulp of the terms' size, which a mean near 0 (terms that
    # cancel) does not scale down; so the absolute tolerance follows the leaf's largest term.
    scale = max(float(np.abs(t).max()) for t in terms)
    np.testing.assert_allclose(np.asarray(value), want, rtol=1e-6, atol=1e-6 * scale, err_msg=key)


def test_average_rejects_different_models_and_a_single_checkpoint(tmp_path, capsys):
  _save(tmp_path / "a", seed=0)
  _save(tmp_path / "b", seed=1, config=dataclasses.replace(CONFIG, num_layers=CONFIG.num_layers - 1,
                                                           layer_types=CONFIG.layer_types[:-1]))
  script = load_script("scripts/average_models.py")
  assert script.main(["average_models.py", f"--ckpt={tmp_path / 'a'},{tmp_path / 'b'}", f"--out={tmp_path / 'o'}"]) == 1
  assert "configs differ" in capsys.readouterr().err
  assert script.main(["average_models.py", f"--ckpt={tmp_path / 'a'}", f"--out={tmp_path / 'o'}"]) == 1
  assert "two or more" in capsys.readouterr().err
  assert script.main(["average_models.py", f"--ckpt={tmp_path / 'a'},{tmp_path / 'nope'}",
                      f"--out={tmp_path / 'o'}"]) == 1
  assert "does not exist" in capsys.readouterr().err
