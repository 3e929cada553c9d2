"""Learn a byte-level BPE tokenizer from your training data (dgemma/tasks/text/bpe.py), for a model from scratch.

    python scripts/make_tokenizer.py --data=data/stdlib_code/train.jsonl --vocab_size=1024 \
        --out=data/stdlib_code/tokenizer.json
    python train.py --config=configs/text.py:tokenizer=data/stdlib_code/tokenizer.json

The texts are read as the text task reads them (JSONL prompt/response or `messages`, ArrayRecord, plain-text files
or directories; format from the path, or --format): every turn's content, or each file's text. Learn it from the
training split only, so held-out numbers stay held out. Ids 0..4 are PAD, EOS, BOS and Gemma 3's turn markers, as
in the byte vocabulary. Prints the vocabulary size, bytes per token on the data and the file's sha256.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402
from dgemma.tasks.text import readers  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("data", None, "Training data: a JSONL or ArrayRecord file, a text file or a directory.", **_D)
flags.DEFINE_enum("format", "auto", list(readers.FORMATS), "auto: from the path.", **_D)
flags.DEFINE_integer("vocab_size", 1024, "Ids in all (specials and the 256 bytes included); a multiple of 16 "
                     "keeps the CPU sampler's token-statistics kernel usable.", **_D)
flags.DEFINE_string("out", None, "The tokenizer.json to write.", **_D)
flags.DEFINE_string("prompt_field", "prompt", "JSONL: the prompt's field.", **_D)
flags.DEFINE_string("response_field", "response", "JSONL: the response's field.", **_D)
flags.DEFINE_string("messages_field", "messages", "JSONL: the chat messages' field.", **_D)


def run() -> int:
  if not FLAGS.data or not FLAGS.out:
    raise ValueError("--data and --out are required")
  if not FLAGS.out.endswith(".json"):
    raise ValueError(f"--out={FLAGS.out}: a tokenizer.json file name must end in .json")
  cli.check_output_path(FLAGS.out, "--out")
  from dgemma.tasks.text import bpe
  fields = readers.Fields(FLAGS.prompt_field, FLAGS.response_field, FLAGS.messages_field)
  data = readers.read_texts(FLAGS.data, FLAGS.format, fields)
  if not any(data):
    raise ValueError(f"{FLAGS.data} holds no text")
  learned = bpe.learn(data, FLAGS.vocab_size, FLAGS.out)
  size = learned.vocab_size
  print(f"wrote {FLAGS.out}: {size} ids ({learned.num_texts} texts, {learned.bytes_per_token:.2f} bytes/token on "
        f"them), sha256 {learned.sha256}")
  if size % 16:
    print(f"note: {size} ids is not a multiple of 16: configs/text.py:tokenizer= rounds the model's vocabulary up")
  return 0


def main(argv: list[str]) -> int:
  """Runs with command-line `argv`; bad input prints one `error:` line and returns a non-zero code."""
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
