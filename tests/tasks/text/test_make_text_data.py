"""scripts/make_text_data.py on a small synthetic "standard library" the test writes."""

import ast
import hashlib
import json
import os
import subprocess
import sys

import pytest

from configs import text as text_config
from dgemma import tasks
from dgemma.config import small_dense
from dgemma.data.tokenizer import load_tokenizer
from dgemma.tasks.text import bpe, byte_tokenizer, readers
from tests.script_loader import ROOT, load_script

mtd = load_script("scripts/make_text_data.py")

FUNCS = '''\
import functools


@functools.lru_cache(maxsize=None)
def top(a,
        b=1):
    """Add things.

    Longer text, indented.
    """
    # a comment right after the docstring
    c = a + b
    return c


def no_doc(x):
    y = x
    return y


def one_statement(x):
    """Too short."""
    return x


def shares_a_line(x):
    """Doc."""; y = x
    return y


class Outer:
    """A class."""

    def method(self, n):
        """A method.

        With a second paragraph.
        """
        text = """first
  less indented than the method
"""
        if n:
            return text
        return None

    async def coro(self):
        """An async method."""
        def inner(v):
            """Nested."""
            w = v * 2
            return w
        x = inner(1)
        return x


def long_body():
    """Long."""
    a = 1
    b = "%s"
'''


def expected_functions(source, module):
  """(module, qualname) -> AST dump of each function with a docstring, found independently of the script."""
  out = {}

  def visit(node, scope):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        out[(module, scope + child.name)] = ast.dump(child)
        visit(child, scope + child.name + ".<locals>.")
      elif isinstance(child, ast.ClassDef):
        visit(child, scope + child.name + ".")
      else:
        visit(child, scope)
  visit(ast.parse(source), "")
  return out


def write_stdlib(root):
  sources = {}
  files = {"funcs.py": FUNCS.replace('"%s"', repr("x" * 300)), "pkg/__init__.py": FUNCS, "pkg/sub.py": FUNCS,
           "test/test_funcs.py": FUNCS, "pkg/tests/t.py": FUNCS, "__pycache__/c.py": FUNCS, "idlelib/i.py": FUNCS,
           "broken.py": "def f(:\n", "notes.txt": FUNCS}
  for k in range(12):
    files[f"mod{k}.py"] = FUNCS
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
    sources[rel] = text
  return sources


def build(tmp_path, out="out", **kw):
  kw = dict(dict(min_statements=2, max_chars=200, validation_percent=30, test_percent=30, log=lambda s: None), **kw)
  return mtd.build(str(tmp_path / "stdlib"), str(tmp_path / out), **kw)


def read(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_records_reproduce_the_functions_and_splits_are_by_module(tmp_path):
  sources = write_stdlib(tmp_path / "stdlib")
  manifest = build(tmp_path)
  expected = {}
  for rel, text in sources.items():
    if rel.endswith(".py") and rel.split("/")[0] not in ("test", "__pycache__", "idlelib", "broken.py") \
        and "/tests/" not in rel:
      expected.update(expected_functions(text, rel[:-3].replace("/__init__", "").replace("/", ".")))
  records = {s: read(tmp_path / "out" / f"{s}.jsonl") for s in mtd.SPLITS}
  seen = set()
  for split, rows in records.items():
    for r in rows:
      key = (r["module"], r["name"])
      assert key not in seen
      seen.add(key)
      body = ast.parse(r["prompt"] + r["response"]).body
      assert len(body) == 1 and ast.dump(body[0]) == expected[key]
      # the prompt ends with the docstring: its last line ends where the docstring's closing quotes do
      head = ast.parse(r["prompt"] + "    pass\n").body[0]
      assert [type(s) for s in head.body] == [ast.Expr, ast.Pass]
      assert head.body[0].value.value == body[0].body[0].value.value
      prompt_lines = r["prompt"].splitlines(keepends=True)
      assert head.body[0].end_lineno == len(prompt_lines)
      assert prompt_lines[-1].encode()[head.body[0].end_col_offset:] == b"\n"
      assert mtd.split_of(r["module"], 30, 30) == split
  modules = [{r["module"] for r in rows} for rows in records.values()]
  assert all(modules) and not (modules[0] & modules[1] or modules[0] & modules[2] or modules[1] & modules[2])
  names = {name for _, name in seen}
  assert names == {"top", "Outer.method", "Outer.coro", "Outer.coro.<locals>.inner", "long_body"}
  assert ("funcs", "long_body") not in seen  # 300 characters > max_chars
  assert {m for m, _ in seen} == {f"mod{k}" for k in range(12)} | {"pkg", "pkg.sub", "funcs"}
  assert manifest["unparsable_files"] == ["broken"]
  assert manifest["skipped_functions"] == {"docstring shares a line": 15, "long body": 1, "short body": 15}
  method = next(r for r in records["train"] + records["validation"] + records["test"] if r["name"] == "Outer.method")
  assert method["prompt"].startswith("def method(self, n):\n") and method["response"].startswith("    text = ")
  assert '\n  less indented than the method\n' in method["response"]  # string contents keep their bytes
  top = next(r for r in records["train"] + records["validation"] + records["test"] if r["name"] == "top")
  assert top["prompt"].startswith("@functools.lru_cache(maxsize=None)\ndef top(a,\n        b=1):\n")
  assert top["response"].startswith("    # a comment right after the docstring\n")


def test_deterministic_with_a_matching_manifest(tmp_path):
  write_stdlib(tmp_path / "stdlib")
  first, second = build(tmp_path, "a"), build(tmp_path, "b")
  assert first == second
  for split in mtd.SPLITS:
    a, b = (tmp_path / "a" / f"{split}.jsonl").read_bytes(), (tmp_path / "b" / f"{split}.jsonl").read_bytes()
    assert a == b
    assert first["splits"][split]["sha256"] == hashlib.sha256(a).hexdigest()
    assert first["splits"][split]["records"] == len(a.splitlines())
  assert "tokenizer" not in first  # (vocab_size=0)
  on_disk = json.loads((tmp_path / "a" / "manifest.json").read_text())
  assert on_disk == first and on_disk["python"] == sys.version
  assert on_disk["options"] == {"min_body_statements": 2, "max_body_chars": 200, "validation_percent": 30,
                                "test_percent": 30}


def test_the_tokenizer_is_make_tokenizers_on_the_train_split(tmp_path):
  write_stdlib(tmp_path / "stdlib")
  manifest = build(tmp_path, vocab_size=300)
  path = tmp_path / "out" / "tokenizer.json"
  assert manifest["tokenizer"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
  assert manifest["tokenizer"]["vocab_size"] == load_tokenizer(path).vocab_size
  assert json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"] == manifest["tokenizer"]
  script = load_script("scripts/make_tokenizer.py")
  assert script.main(["make_tokenizer.py", f"--data={tmp_path / 'out' / 'train.jsonl'}", "--vocab_size=300",
                      f"--out={tmp_path / 'same.json'}"]) == 0
  assert (tmp_path / "same.json").read_bytes() == path.read_bytes()  # the same texts, the same trainer
  with pytest.raises(ValueError, match="--vocab_size 200 leaves no room for merges"):
    build(tmp_path, "c", vocab_size=200)


def test_the_text_reader_reads_the_output(tmp_path):
  write_stdlib(tmp_path / "stdlib")
  manifest = build(tmp_path)
  records = readers.read(str(tmp_path / "out" / "train.jsonl"), "auto", None, readers.Fields(), "error", 8, 8)
  assert len(records) == manifest["splits"]["train"]["records"]
  row = read(tmp_path / "out" / "train.jsonl")[0]
  assert [t.content for t in records.items[0]] == [row["prompt"], row["response"]]


def test_bad_stdlib_dir_is_one_line(tmp_path):
  run = subprocess.run([sys.executable, "scripts/make_text_data.py", f"--stdlib_dir={tmp_path}/none",
                        f"--out_dir={tmp_path}/out"], cwd=ROOT, capture_output=True, text=True)
  assert run.returncode != 0 and run.stderr == f"make_text_data: --stdlib_dir {tmp_path}/none is not a directory\n"


def test_the_text_config_defaults_to_the_train_split_and_its_tokenizer(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no data/ here
  with pytest.raises(ValueError, match=r"^tokenizer file data/stdlib_code/tokenizer.json does not exist: build the "
                                       r"data and its tokenizer with python scripts/make_text_data.py \(or pass "
                                       r"tokenizer=bytes or tokenizer=FILE\)$"):
    text_config.get_config("size=debug")
  c = text_config.get_config("size=debug,tokenizer=bytes")
  assert c.data.path == "data/stdlib_code/train.jsonl" and c.model.vocab_size == byte_tokenizer.VOCAB_SIZE
  task = tasks.for_config(c, small_dense(byte_tokenizer.VOCAB_SIZE, 32, 1, 2, canvas_length=c.model.canvas_length))
  with pytest.raises(FileNotFoundError, match=r"^data file data/stdlib_code/train.jsonl does not exist: build it "
                                              r"with python scripts/make_text_data.py \(or pass data=PATH\)$"):
    task.train_dataset(c, 2, 0, 1, False)

  write_stdlib(tmp_path / "stdlib")
  mtd.build(str(tmp_path / "stdlib"), "data/stdlib_code", log=lambda s: None, vocab_size=320)
  c = text_config.get_config("size=debug")  # now the BPE learned beside the data
  learned = load_tokenizer("data/stdlib_code/tokenizer.json")
  assert c.data.tokenizer == "data/stdlib_code/tokenizer.json"
  assert c.model.vocab_size == -(-learned.vocab_size // 16) * 16 and learned.vocab_size > bpe.BASE_SIZE
  task = tasks.for_config(c, small_dense(c.model.vocab_size, 32, 1, 2, canvas_length=c.model.canvas_length))
  assert task.tokenizer.vocab_size == learned.vocab_size
  batch = next(iter(task.train_dataset(c, 2, 0, 1, False)))
  assert batch["prompt"].shape == (2, c.data.prompt_len)
  assert batch["prompt"].max() >= bpe.BASE_SIZE  # merged ids: the prompts were encoded with the learned BPE
  # Other data, or a checkpoint to start from, keep their own default (bytes; the checkpoint's).
  other = text_config.get_config(f"size=debug,data={tmp_path / 'mine.jsonl'}")
  assert other.data.tokenizer == "" and other.model.vocab_size == byte_tokenizer.VOCAB_SIZE
