"""sample.py on a tiny text checkpoint with its own tokenizer: output, step-by-step display, and bad input."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from dgemma import model
from dgemma.checkpoints import save_model
from dgemma.config import small_dense
from tests.script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = "why is the sky blue because light scatters in air and red sun".split()


def _sample_module():
  return load_script("sample.py")


def _write_tokenizer(path, chat_template):
  vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
  for w in WORDS:
    vocab[w] = len(vocab)
  while len(vocab) < 64:
    vocab[f"w{len(vocab)}"] = len(vocab)
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
  tok.decoder = decoders.WordPiece()
  tok.save(os.path.join(path, "tokenizer.json"))
  if chat_template:
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                 "pad_token": "<pad>", "unk_token": "<unk>",
                 "chat_template": "{{ bos_token }}{% for m in messages %}why {{ m['content'] }}{% endfor %}"}, f)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  root = tmp_path_factory.mktemp("cli")
  config = small_dense(64, width=16, num_layers=1, num_heads=2, canvas_length=4, stop_ids=(1,))
  params = model.init_params(config, jax.random.key(0))
  paths = {}
  for name, tokenizer in (("chat", "chat"), ("plain", "plain"), ("bare", None)):
    paths[name] = str(root / name)
    save_model(paths[name], config, params)
    if tokenizer:
      _write_tokenizer(paths[name], chat_template=tokenizer == "chat")
  corrupt = root / "corrupt"
  corrupt.mkdir()
  (corrupt / "dgemma.json").write_text("{not json")
  paths["corrupt"] = str(corrupt)
  return paths


def _run(args, capsys):
  rc = _sample_module().main(["sample.py", *args])
  out = capsys.readouterr()
  return rc, out.out, out.err


def test_text_prompt_with_chat_template_and_steps(ckpts, capsys, tmp_path):
  html = tmp_path / "s.html"
  rc, out, err = _run([f"--ckpt={ckpts['chat']}", "--prompt=is the sky blue", "--max_new_tokens=8", "--steps=3",
                       "--show_steps", f"--show_steps_html={html}"], capsys)
  assert rc == 0, err
  assert "=== prompt 1/1" in out and "steps per canvas:" in out
  assert "tokens per forward pass" in out and "tokens/s" in out and "compile" in out
  frames = [line for line in out.splitlines() if line.startswith("--- canvas")]
  assert frames[0] == "--- canvas 1/2 · step 1/3" and len(frames) >= 2
  page = html.read_text()
  assert "const frames =" in page and "canvas 1/2" in page


def test_chat_template_is_applied(ckpts):
  sample = _sample_module()
  chat, plain = sample.TextTokenizer(ckpts["chat"]), sample.TextTokenizer(ckpts["plain"])
  assert chat.hf is not None and plain.hf is None  # transformers where a tokenizer_config.json says so
  assert chat.chat_template and not plain.chat_template
  # The template prepends "why"; the plain tokenizer adds only BOS.
  assert chat.encode("is the sky blue", chat=True) == [2, 4, 5, 6, 7, 8]
  assert plain.encode("is the sky blue", chat=False) == [2, 5, 6, 7, 8]
  assert plain.piece(7) == "sky " and plain.decode([2, 6, 7, 1]) == "the sky"


def test_prompt_ids_batch(ckpts, capsys):
  rc, out, err = _run([f"--ckpt={ckpts['bare']}", "--prompt_ids=2,5,6;2,7", "--max_new_tokens=4",
                       "--steps=2", "--seed=3"], capsys)
  assert rc == 0, err
  assert "=== prompt 2/2" in out and "2 prompt(s)" in out


def _configs_sampled(monkeypatch, capsys, ckpt, flag_sets):
  """Runs sample.py once per flag set and returns the (config, params) that reached `compile_generate`."""
  generate_module = importlib.import_module("dgemma.sampling.generate")  # the package shadows it by a function
  seen = []
  real = generate_module.compile_generate

  def spy(params, config, *args, **kwargs):
    seen.append((config, params))
    return real(params, config, *args, **kwargs)

  monkeypatch.setattr(generate_module, "compile_generate", spy)
  for flags in flag_sets:
    rc, out, err = _run([f"--ckpt={ckpt}", "--prompt_ids=2,5", "--max_new_tokens=4", "--steps=2", *flags], capsys)
    assert rc == 0, err
    assert "tokens/s" in out
  return seen


def test_cache_per_canvas_flag_reaches_the_sampler(ckpts, capsys, monkeypatch):
  generate_module = importlib.import_module("dgemma.sampling.generate")
  samplers = []
  real = generate_module.compile_generate
  monkeypatch.setattr(generate_module, "compile_generate",  # (params, config, tokens, valid, key, sampler)
                      lambda *args, **kwargs: samplers.append(args[5].resolve(args[1])) or real(*args, **kwargs))
  for flags in ([], ["--nocache_per_canvas"]):
    rc, out, err = _run([f"--ckpt={ckpts['bare']}", "--prompt_ids=2,5", "--max_new_tokens=12", "--steps=2",
                         "--stop_ids=none", *flags], capsys)
    assert rc == 0, err
    assert "steps per canvas: [2, 2, 2]" in out  # three canvases ran (three cache buckets by default)
  assert [s.cache_per_canvas for s in samplers] == [True, False]


def test_moe_impl_overrides_the_checkpoint_config(ckpts, capsys, monkeypatch):
  seen = _configs_sampled(monkeypatch, capsys, ckpts["bare"], ([], ["--moe_impl=dense"]))
  assert [config.moe_impl for config, _ in seen] == ["xla", "dense"]  # the checkpoint's choice, then the flag's


def test_matmul_dtype_runs_float32_weights_with_bf16_matmuls(ckpts, capsys, monkeypatch, tmp_path):
  """--matmul_dtype=bfloat16 on a bf16 checkpoint: the sampler gets float32 parameters equal to the checkpoint's
  bf16 weights and a config that multiplies bf16 operands (tests/model/test_mixed_matmul.py checks that product)."""
  config = small_dense(64, width=16, num_layers=1, num_heads=2, canvas_length=4, stop_ids=(1,),
                       param_dtype="bfloat16")
  save_model(str(tmp_path / "bf16"), config, model.init_params(config, jax.random.key(0)))
  (plain_config, plain), (config, params) = _configs_sampled(monkeypatch, capsys, tmp_path / "bf16",
                                                             ([], ["--matmul_dtype=bfloat16"]))
  assert (plain_config.param_dtype, plain_config.matmul_dtype) == ("bfloat16", "")
  assert (config.param_dtype, config.matmul_dtype) == ("float32", "bfloat16")
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(params)):
    assert a.dtype == jax.numpy.bfloat16 and b.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))


@pytest.mark.parametrize("args, message", [
    (["--ckpt={missing}", "--prompt=hi"], "error: checkpoint {missing} does not exist"),
    (["--ckpt={corrupt}", "--prompt=hi"], "error: cannot load checkpoint {corrupt}: "),
    (["--ckpt={bare}", "--prompt=hi"], "error: checkpoint {bare} has no tokenizer (tokenizer.json or a "
                                       "SentencePiece .model); pass --prompt_ids=1,2,3"),
    (["--ckpt={plain}", "--prompt=hi", "--chat=on"], "error: --chat=on but the tokenizer of {plain} has no chat"),
    (["--ckpt={bare}", "--prompt_ids=2,5,6", "--max_cache_len=10"],
     "error: a prompt of 3 tokens plus 64 canvas(es) of 4 tokens needs 259 tokens of context, more than "
     "max_cache_len=10"),
    (["--ckpt={bare}", "--prompt_ids=2,5,6", "--t_max=0.3"], "error: t_max must be > t_min"),
    (["--ckpt={bare}", "--prompt_ids=2,5,6", "--t_max=1e39"],  # finite in Python, inf in float32
     "error: t_max must be a finite float32 number (|x| < 3.4e38), got 1e+39"),
    (["--ckpt={bare}", "--prompt_ids=2,5,6", "--confidence_threshold=1e39"],
     "error: confidence_threshold must be a finite float32 number (|x| < 3.4e38), got 1e+39"),
    (["--ckpt={bare}", "--prompt_ids=2,5,6", "--steps=0"], "error: max_denoising_steps must be a positive"),
    (["--ckpt={bare}", "--prompt_ids=2,x"], "error: --prompt_ids must be comma-separated integers"),
    (["--ckpt={bare}", "--prompt_ids=2,99"], "error: prompt_tokens has token ids outside [0, 64)"),
    (["--ckpt={bare}", "--prompt_ids=2", "--samples=2"], "error: --samples > 1 needs a task checkpoint"),
    (["--ckpt={bare}", "--prompt_ids=2", "--samples=0"], "error: --samples must be >= 1, got 0"),
    (["--ckpt={bare}"], "error: give exactly one of --prompt, --prompt_ids or --prompts_file"),
    (["--ckpt={bare}", "--prompt_ids=;"], "error: --prompt_ids has no prompts"),
    (["--ckpt={bare}", "--prompt_ids=2", "--seed=4294967296"], "error: --seed must be in [0, 2**32), got 4294967296"),
    (["--ckpt={bare}", "--prompt_ids=2", "--stop_ids=1,64"], "error: stop_ids has token ids outside [0, 64)"),
    (["--ckpt={bare}", "--prompt_ids=2", "--steps=abc"], "error: flag --steps=abc"),
    (["--ckpt={bare}", "--prompt_ids=2", "--moe_impl=ragged"],
     "error: flag --moe_impl=ragged: value should be one of <xla|dense|pallas>"),
])
def test_bad_input_gives_one_line(ckpts, capsys, tmp_path, args, message):
  names = dict(ckpts, missing=str(tmp_path / "nope"))
  rc, _, err = _run([a.format(**names) for a in args], capsys)
  assert rc != 0
  assert err.count("\n") == 1 and err.startswith(message.format(**names)), err


def test_runs_as_a_program(ckpts, tmp_path):
  proc = subprocess.run([sys.executable, str(ROOT / "sample.py"), f"--ckpt={tmp_path / 'nope'}", "--prompt=hi"],
                        capture_output=True, text=True, cwd=str(ROOT), env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1
  assert proc.stderr.strip() == f"error: checkpoint {tmp_path / 'nope'} does not exist"


def _jsonl(path, lines):
  path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
  return path


def test_jsonl_prompts_in_and_out_whatever_the_batch_size(ckpts, capsys, tmp_path):
  given = [{"prompt": "is the sky blue", "id": 7}, "", {"messages": [{"role": "user", "content": "red sun"}]},
           {"prompt": "light scatters in air"}]
  prompts = _jsonl(tmp_path / "in.jsonl", given)
  common = [f"--ckpt={ckpts['chat']}", f"--prompts_file={prompts}", "--max_new_tokens=8", "--steps=3", "--seed=5"]
  rc, out, err = _run([*common, f"--output={tmp_path / 'one_batch.jsonl'}"], capsys)
  assert rc == 0, err
  one_batch = [json.loads(line) for line in (tmp_path / "one_batch.jsonl").read_text().splitlines()]
  rc, out, err = _run([*common, "--batch_size=2"], capsys)  # no --output: the JSON lines on stdout
  assert rc == 0, err
  assert [json.loads(line) for line in out.splitlines()] == one_batch  # each row draws from its own key
  assert "3 prompt(s)" in err and "2 batches of 2" in err
  assert [{k: v for k, v in r.items() if k in ("prompt", "messages")} for r in one_batch] == [
      {"prompt": "is the sky blue"}, {"messages": [{"role": "user", "content": "red sun"}]},
      {"prompt": "light scatters in air"}]
  tokenizer = _sample_module().TextTokenizer(ckpts["chat"])
  for record in one_batch:
    assert record["completion"] == tokenizer.decode(record["tokens"])
    assert 1 not in record["tokens"] and 0 not in record["tokens"]  # cut at the stop id, no PAD
    assert record["steps"] and all(1 <= s <= 3 for s in record["steps"])


@pytest.mark.parametrize("line, message", [
    ('{"prompt": 3}', 'no string field "prompt" (and no "messages" list); keys: prompt'),
    ("not json", "not valid JSON"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
     "a prompt must end with a user turn"),
    ('{"messages": [{"role": "user"}]}', '"messages" must be a list of {"role": str, "content": str} objects'),
])
def test_a_malformed_jsonl_prompt_names_its_line(ckpts, capsys, tmp_path, line, message):
  prompts = _jsonl(tmp_path / "in.jsonl", [{"prompt": "is the sky blue"}, line])
  rc, _, err = _run([f"--ckpt={ckpts['chat']}", f"--prompts_file={prompts}"], capsys)
  assert rc != 0
  assert err.count("\n") == 1 and err.startswith(f"error: {prompts}:2: {message}"), err


def test_stream_shows_every_step_and_leaves_the_sample_unchanged(ckpts, capsys):
  args = [f"--ckpt={ckpts['chat']}", "--prompt=is the sky blue", "--max_new_tokens=8", "--steps=3", "--seed=2"]
  rc, plain, _ = _run(args, capsys)
  assert rc == 0
  rc, streamed, live = _run([*args, "--stream"], capsys)
  assert rc == 0
  answer = lambda out: [line for line in out.splitlines() if not line.startswith("--- time")]  # noqa: E731
  assert answer(streamed) == answer(plain)
  labels = [line for line in live.splitlines() if line.startswith("--- canvas")]
  steps = json.loads(streamed.split("steps per canvas: ")[1].splitlines()[0])
  assert labels == [f"--- canvas {i + 1}/2 · step {s + 1}/3" for i, n in enumerate(steps) for s in range(n)]
