"""Readers on small files the tests write: JSONL (prompt/response, configurable fields, chat messages), plain
text (file, directory, documents), ArrayRecord; malformed input stops with FILE:LINE or is skipped and counted."""

import json

import pytest

from dgemma.tasks.text import byte_tokenizer, readers
from dgemma.tasks.text.chat import Turn

TOK = byte_tokenizer.byte_tokenizer()
FIELDS = readers.Fields()


def write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def read(path, fmt="auto", fields=FIELDS, on_malformed="error", prefix=4, continuation=6, separator=""):
  return readers.read(str(path), fmt, TOK, fields, on_malformed, prefix, continuation, separator)


def items(records):
  if records.lazy is not None:
    return [readers.parse_json(records.lazy[i], FIELDS) for i in range(len(records))]
  return [records.items[i] for i in range(len(records))]


def test_jsonl_prompt_response_and_messages(tmp_path):
  path = write_jsonl(tmp_path / "d.jsonl", [
      {"prompt": "p1", "response": "r1", "extra": 3},
      "",  # a blank line is no record
      {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a"}]}])
  records = read(path)
  assert items(records) == [(Turn("user", "p1"), Turn("assistant", "r1")),
                            (Turn("system", "s"), Turn("user", "u"), Turn("assistant", "a"))]
  assert [records.where(i) for i in range(2)] == [f"{path}:1", f"{path}:3"] and records.skipped == 0


def test_jsonl_field_names_are_configurable(tmp_path):
  path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}, {"chat": [
      {"role": "user", "content": "x"}, {"role": "model", "content": "y"}]}])
  records = read(path, fields=readers.Fields("question", "answer", "chat"))
  assert items(records) == [(Turn("user", "q"), Turn("assistant", "a")), (Turn("user", "x"), Turn("model", "y"))]


@pytest.mark.parametrize("line, message", [
    ("{not json", r"not valid JSON"),
    ('["a list"]', r"expected a JSON object, got list"),
    ('{"prompt": "p"}', r"no string field 'response' \(and no 'messages' list\); keys: prompt"),
    ('{"prompt": "p", "response": 3}', r"no string field 'response'"),
    ('{"messages": [{"role": "user", "content": "u"}]}', r"the last of the 'messages' must be an assistant turn"),
    ('{"messages": [{"role": "user"}]}', r"'messages' must be a list of"),
    ('{"messages": [{"role": "user", "content": "u"}, {"role": "user", "content": "v"}, '
     '{"role": "assistant", "content": "a"}]}', r"roles must alternate user/assistant, starting with user"),
    ('{"messages": [{"role": "user", "content": "u"}, {"role": "bot", "content": "a"}]}',
     r"the last of the 'messages' must be an assistant turn"),
])
def test_a_malformed_line_is_one_error_naming_file_and_line(tmp_path, line, message):
  path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "response": "r"}, line])
  with pytest.raises(readers.MalformedRecord, match=rf"^{path}:2: {message}") as e:
    read(path)
  assert "\n" not in str(e.value)
  records = read(path, on_malformed="skip")  # or dropped and counted
  assert len(records) == 1 and records.skipped == 1


def test_a_line_that_is_not_utf8_is_named(tmp_path):
  path = tmp_path / "d.jsonl"
  path.write_bytes(b'{"prompt": "p", "response": "r"}\n{"prompt": "\xff", "response": "r"}\n')
  with pytest.raises(readers.MalformedRecord, match=rf"^{path}:2: not UTF-8 \(invalid start byte at byte 12\)$"):
    read(path)


def test_plain_text_windows(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "b.txt").write_text("0123456789abcdefghij")  # 20 bytes: windows of 4 + 6
  (tmp_path / "docs" / "a.txt").write_text("xyz")  # too short for a window: skipped, counted
  (tmp_path / "docs" / "sub").mkdir()
  (tmp_path / "docs" / "sub" / "c.txt").write_text("ABCDEFG")
  records = read(tmp_path / "docs")
  b = lambda s: tuple(byte_tokenizer.BYTE_OFFSET + x for x in s.encode())  # noqa: E731
  bos = (TOK.bos_id,)
  assert items(records) == [
      readers.Tokens(bos + b("0123"), b("456789")), readers.Tokens(bos + b("abcd"), b("efghij")),
      readers.Tokens(bos + b("ABCD"), b("EFG"))]
  assert records.skipped == 1
  assert records.where(1) == f"{tmp_path / 'docs' / 'b.txt'} (token 10)"


def test_plain_text_documents_split_at_a_separator(tmp_path):
  path = tmp_path / "corpus.txt"
  path.write_text("first doc\n===\nsecond one")
  records = read(path, separator="\n===\n", prefix=5, continuation=20)
  got = [(TOK.decode(r.prompt), TOK.decode(r.response)) for r in items(records)]
  assert got == [("<bos>first", " doc"), ("<bos>secon", "d one")]
  assert records.where(1) == f"{path} (document 2, token 0)"


def test_array_record(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter
  rows = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(5)] + [
      {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}]
  path = str(tmp_path / "d.array_record")
  writer = ArrayRecordWriter(path, "group_size:1")
  for row in rows:
    writer.write(json.dumps(row).encode())
  writer.close()
  records = read(path)
  assert len(records) == 6 and records.lazy is not None  # read when asked, not held in memory
  assert items(records)[:5] == [(Turn("user", f"p{i}"), Turn("assistant", f"r{i}")) for i in range(5)]
  assert items(records)[5] == (Turn("user", "u"), Turn("assistant", "a"))
  assert records.where(4) == f"{path}#4"


def test_bad_paths_and_knobs(tmp_path):
  with pytest.raises(FileNotFoundError, match="data file .*nope.jsonl does not exist"):
    read(tmp_path / "nope.jsonl")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="holds no files"):
    read(tmp_path / "empty")
  path = write_jsonl(tmp_path / "d.jsonl", ["{bad"])
  with pytest.raises(ValueError, match=r"holds no usable records \(1 skipped\)"):
    read(path, on_malformed="skip")
  with pytest.raises(ValueError, match="unknown data format 'csv'"):
    read(path, fmt="csv")
  with pytest.raises(ValueError, match="on_malformed must be one of error, skip"):
    read(path, on_malformed="ignore")
