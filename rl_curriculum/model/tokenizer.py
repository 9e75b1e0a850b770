"""Tokenizers: a SentencePiece model trained on a task corpus, for models trained here.

The tiny model trained from scratch (configs/scratch.py) has no pretrained vocabulary, so its
tokenizer is trained on the text of the task it learns (prompts and targets). Digits are split into single pieces so numbers are read
digit by digit, which is what arithmetic needs. Checkpoints that ship their own tokenizer are read
by `rl_curriculum.model` loaders instead.

Special ids are fixed: pad 0, unk 1, bos 2, eos 3.
"""

import io
from typing import Iterable, Sequence

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NUM_RESERVED = 4  # the ids above, which no piece of the corpus takes


class SentencePieceTokenizer:
  """Encodes text to ids and back with a SentencePiece model held in memory."""

  def __init__(self, model_proto: bytes):
    self.model_proto = bytes(model_proto)
    self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  @property
  def pad_id(self) -> int:
    return self._sp.pad_id()

  @property
  def bos_id(self) -> int:
    return self._sp.bos_id()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Returns the ids of `text`, optionally framed by BOS and EOS."""
    return self._sp.encode(text, add_bos=add_bos, add_eos=add_eos)

  def encode_text(self, text: str) -> list[int]:
    """The ids of `text` as plain text (`encode`: SentencePiece never reads a control symbol's
    id from text)."""
    return self._sp.encode(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Returns the text of `ids`, stopping at the first EOS and skipping pad, BOS and unknown."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i in (self.pad_id, self.bos_id) or not 0 <= i < self.vocab_size:
        continue
      out.append(i)
    return self._sp.decode(out)

  def save(self, path: str) -> None:
    """Writes the SentencePiece model file (readable by `load`)."""
    with open(path, "wb") as f:
      f.write(self.model_proto)

  @classmethod
  def load(cls, path: str) -> "SentencePieceTokenizer":
    with open(path, "rb") as f:
      return cls(f.read())


def train_sentencepiece(texts: Iterable[str], *, vocab_size: int = 256,
                        model_type: str = "unigram",
                        split_digits: bool = True) -> SentencePieceTokenizer:
  """Trains a SentencePiece model on `texts` and returns its tokenizer.

  Args:
    texts: the corpus, one example per string (for example every prompt and target of a task).
    vocab_size: the largest vocabulary wanted; a small corpus may yield fewer pieces (the limit is
      soft), so read `tokenizer.vocab_size` afterwards.
    model_type: "unigram", "bpe", "char" or "word".
    split_digits: split numbers into single digits.

  Raises:
    ValueError: the corpus is empty, or `vocab_size` is below what it needs (a piece for every
      distinct character, every one kept, plus the 4 reserved ids), or the trainer refused it.
  """
  texts = [t for t in texts if t]
  if not texts:
    raise ValueError("cannot train a tokenizer on an empty corpus")
  needed = len(set().union(*map(set, texts))) + NUM_RESERVED
  if vocab_size < needed:
    raise ValueError(f"{vocab_size} is too small for this corpus: it needs at least {needed} "
                     f"pieces ({needed - NUM_RESERVED} distinct characters and {NUM_RESERVED} "
                     "reserved ids)")
  buffer = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buffer, vocab_size=vocab_size,
        model_type=model_type, split_digits=split_digits, hard_vocab_limit=False,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, character_coverage=1.0,
        add_dummy_prefix=False, remove_extra_whitespaces=False, num_threads=1, minloglevel=2)
  except RuntimeError as e:  # the trainer's own checks, as one line
    raise ValueError(f"SentencePiece refused vocab_size={vocab_size}: "
                     f"{' '.join(str(e).split())[:300]}") from e
  return SentencePieceTokenizer(buffer.getvalue())
