"""Build the stdlib code-completion data set: Python functions of the running interpreter's standard library.

    python scripts/make_text_data.py --out_dir=data/stdlib_code

Each function or method with a docstring and a body of at least --min_body_statements statements (after the
docstring) and at most --max_body_chars characters becomes one JSONL record:
    {"prompt": decorators + signature + docstring, "response": the rest of the body,
     "module": "json.decoder", "name": "JSONDecoder.raw_decode"}
Both are the source text exactly, with the def's own indentation removed from every code line (string literals,
docstrings included, keep their bytes), so ast.parse(prompt + response) gives the function's AST unchanged;
the builder checks that for every record and skips (and counts) any function where it would not hold.
Splits are by module (no module's functions cross splits): sha256 of the dotted module name, mod 100.
Writes OUT_DIR/{train,validation,test}.jsonl, OUT_DIR/tokenizer.json (a byte-level BPE of --vocab_size ids learned
from the training split alone, as scripts/make_tokenizer.py learns it: configs/text.py's default vocabulary for this
data) and OUT_DIR/manifest.json (counts, sha256 of each file, sys.version, the options). The walk is sorted, so one
interpreter gives the same bytes every time; another Python version has another standard library and so other
checksums.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import sys
import sysconfig
import tokenize
from collections import Counter

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from dgemma.tasks.text import bpe, readers  # noqa: E402

SPLITS = ("train", "validation", "test")
TOKENIZER_FILE = "tokenizer.json"
VOCAB_SIZE = 4096  # the learned vocabulary configs/text.py trains with by default (docs/text_results.md: 1024 to 8192 measured)
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__",
                       "encodings"})

_STDLIB_DIR = flags.DEFINE_string("stdlib_dir", None, "Source root (default: sysconfig's stdlib path).")
_OUT_DIR = flags.DEFINE_string("out_dir", "data/stdlib_code", "Output directory.")
_MIN_STATEMENTS = flags.DEFINE_integer("min_body_statements", 2, "Fewest body statements after the docstring.")
_MAX_CHARS = flags.DEFINE_integer("max_body_chars", 2000, "Longest response (characters).")
_VALIDATION = flags.DEFINE_integer("validation_percent", 5, "Modules (by hash) in validation.")
_TEST = flags.DEFINE_integer("test_percent", 5, "Modules (by hash) in test.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", VOCAB_SIZE, "Ids of the BPE learned from the training split "
                                   "(specials and the 256 bytes included); 0: no tokenizer.json.")
_PROGRESS = flags.DEFINE_integer("progress_every", 200, "A progress line every this many files.")


def split_of(module: str, validation_percent: int, test_percent: int) -> str:
  """train / validation / test by the module name alone (a stable hash, not Python's salted hash())."""
  bucket = int.from_bytes(hashlib.sha256(module.encode()).digest()[:8], "big") % 100
  if bucket < test_percent:
    return "test"
  return "validation" if bucket < test_percent + validation_percent else "train"


def source_files(root: str) -> list[tuple[str, str]]:
  """(path, dotted module) of every .py file under root, sorted, skipping SKIP_DIRS."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
    for name in sorted(filenames):
      if not name.endswith(".py"):
        continue
      rel = os.path.relpath(os.path.join(dirpath, name), root)[:-3].split(os.sep)
      if rel[-1] == "__init__":
        rel = rel[:-1]
      if rel and all(part.isidentifier() for part in rel):
        out.append((os.path.join(dirpath, name), ".".join(rel)))
  return sorted(out, key=lambda pm: pm[1])


def string_continuation_lines(text: str) -> set[int]:
  """1-based numbers of the lines that begin inside a string literal (their leading whitespace is its content)."""
  inside, starts = set(), []
  fstring_start, fstring_end = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
  for tok in tokenize.generate_tokens(io.StringIO(text).readline):
    if tok.type == fstring_start:
      starts.append(tok.start[0])
    elif tok.type == fstring_end:
      inside.update(range(starts.pop() + 1, tok.end[0] + 1))
    elif tok.type == tokenize.STRING:
      inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
  return inside


def dedent(lines: list[str], first: int, prefix: str, in_string: set[int]) -> str:
  """lines (line `first` onwards) without `prefix` on each code line; string continuation lines untouched."""
  return "".join(line[len(prefix):] if (first + k) not in in_string and line.startswith(prefix) else line
                 for k, line in enumerate(lines))


def functions(tree: ast.AST):
  """(qualname, node) of every function and method, nested ones included, in source order."""
  def visit(node, scope):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        yield scope + child.name, child
        yield from visit(child, scope + child.name + ".<locals>.")
      elif isinstance(child, ast.ClassDef):
        yield from visit(child, scope + child.name + ".")
      else:
        yield from visit(child, scope)
  yield from visit(tree, "")


def records_of(text: str, module: str, min_statements: int, max_chars: int, skipped: Counter) -> list[dict]:
  """The records of one module's source (see the module docstring); reasons for skipped functions counted."""
  tree = ast.parse(text)
  lines = io.StringIO(text).readlines()  # only "\n" ends a line, as for ast's line numbers (not "\x0c")
  in_string = string_continuation_lines(text)
  out = []
  for qualname, node in functions(tree):
    body = node.body
    if not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
      continue  # no docstring: not a candidate
    if len(body) - 1 < min_statements:
      skipped["short body"] += 1
      continue
    doc = body[0]
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])  # decorators are part of the prompt
    prefix = lines[first - 1][:len(lines[first - 1]) - len(lines[first - 1].lstrip(" \t"))]
    after_doc = lines[doc.end_lineno - 1].encode()[doc.end_col_offset:].decode()  # col offsets are UTF-8 bytes
    if after_doc.strip() or body[1].lineno <= doc.end_lineno or node.lineno == doc.lineno:
      skipped["docstring shares a line"] += 1
      continue
    prompt = dedent(lines[first - 1:doc.end_lineno], first, prefix, in_string)
    response = dedent(lines[doc.end_lineno:node.end_lineno], doc.end_lineno + 1, prefix, in_string)
    if not response.endswith("\n"):
      response += "\n"  # the module's last line had no newline
    if len(response) > max_chars:
      skipped["long body"] += 1
      continue
    try:
      same = ast.dump(ast.parse(prompt + response).body[0]) == ast.dump(node)
    except SyntaxError:
      same = False
    if not same:
      skipped["not reproducible"] += 1
      continue
    out.append({"prompt": prompt, "response": response, "module": module, "name": qualname})
  return out


def build(stdlib_dir: str, out_dir: str, min_statements: int = 2, max_chars: int = 2000, validation_percent: int = 5,
          test_percent: int = 5, progress_every: int = 200, log=print, vocab_size: int = 0) -> dict:
  """Writes the three JSONL files, a tokenizer.json of vocab_size ids (0: none) and manifest.json under out_dir;
  returns the manifest."""
  if not os.path.isdir(stdlib_dir):
    raise ValueError(f"--stdlib_dir {stdlib_dir} is not a directory")
  if vocab_size and vocab_size <= bpe.BASE_SIZE:
    raise ValueError(f"--vocab_size {vocab_size} leaves no room for merges (the specials and bytes take "
                     f"{bpe.BASE_SIZE}); 0 writes no tokenizer")
  if min(validation_percent, test_percent) < 0 or validation_percent + test_percent >= 100:
    raise ValueError("validation_percent and test_percent must be >= 0 and leave some training data")
  files = source_files(stdlib_dir)
  by_split = {s: [] for s in SPLITS}
  modules = {s: set() for s in SPLITS}
  skipped, failed = Counter(), []
  for i, (path, module) in enumerate(files, 1):
    try:
      with tokenize.open(path) as f:
        text = f.read()
      records = records_of(text, module, min_statements, max_chars, skipped)
    except (SyntaxError, UnicodeDecodeError, ValueError, tokenize.TokenError):
      failed.append(module)
      records = []
    if records:
      split = split_of(module, validation_percent, test_percent)
      by_split[split].extend(records)
      modules[split].add(module)
    if progress_every and i % progress_every == 0:
      log(f"{i}/{len(files)} files, {sum(map(len, by_split.values()))} functions")
  os.makedirs(out_dir, exist_ok=True)
  manifest = {"python": sys.version, "stdlib_dir": stdlib_dir, "files": len(files), "unparsable_files": failed,
              "skipped_functions": dict(sorted(skipped.items())), "splits": {},
              "options": {"min_body_statements": min_statements, "max_body_chars": max_chars,
                          "validation_percent": validation_percent, "test_percent": test_percent}}
  for split in SPLITS:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in by_split[split]).encode()
    with open(os.path.join(out_dir, f"{split}.jsonl"), "wb") as f:
      f.write(data)
    manifest["splits"][split] = {"file": f"{split}.jsonl", "records": len(by_split[split]),
                                 "modules": len(modules[split]), "sha256": hashlib.sha256(data).hexdigest()}
  if vocab_size:
    texts = readers.read_texts(os.path.join(out_dir, "train.jsonl"), "jsonl", readers.Fields())
    learned = bpe.learn(texts, vocab_size, os.path.join(out_dir, TOKENIZER_FILE))
    manifest["tokenizer"] = {"file": TOKENIZER_FILE, "vocab_size": learned.vocab_size,
                             "bytes_per_token": round(learned.bytes_per_token, 4), "sha256": learned.sha256}
  with open(os.path.join(out_dir, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
  return manifest


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  stdlib_dir = _STDLIB_DIR.value or sysconfig.get_paths()["stdlib"]
  try:
    m = build(stdlib_dir, _OUT_DIR.value, _MIN_STATEMENTS.value, _MAX_CHARS.value, _VALIDATION.value, _TEST.value,
              _PROGRESS.value, vocab_size=_VOCAB_SIZE.value)
  except (ValueError, OSError) as e:  # (OSError: an --out_dir that is a file or cannot be written)
    sys.exit(f"make_text_data: {e}")
  counts = ", ".join(f"{s} {v['records']} ({v['modules']} modules)" for s, v in m["splits"].items())
  print(f"wrote {_OUT_DIR.value}: {counts}; {m['files']} files, {len(m['unparsable_files'])} unparsable; "
        f"skipped functions: {m['skipped_functions']}")
  if "tokenizer" in m:
    t = m["tokenizer"]
    print(f"wrote {os.path.join(_OUT_DIR.value, t['file'])}: a BPE of {t['vocab_size']} ids learned from the training "
          f"split, {t['bytes_per_token']:.2f} bytes/token on it, sha256 {t['sha256']}")


if __name__ == "__main__":
  app.run(main)
