"""Tests for the task-corpus SentencePiece tokenizer."""

import pytest

from rl_curriculum.model import tokenizer as tok_lib


def _corpus():
  return [f"{a}+{b}={a + b}" for a in range(40) for b in range(40)] + ["3*4-5=7", "(2+3)*4=20"]


def test_round_trip_and_special_ids(tmp_path):
  tok = tok_lib.train_sentencepiece(_corpus(), vocab_size=64)
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3)
  for text in ["12+7=19", "(2+3)*4=20", "99+0=99"]:
    assert tok.decode(tok.encode(text)) == text
  path = tmp_path / "tok.model"
  tok.save(str(path))
  again = tok_lib.SentencePieceTokenizer.load(str(path))
  assert again.encode("12+7=19") == tok.encode("12+7=19")


def test_digits_are_single_pieces():
  tok = tok_lib.train_sentencepiece(_corpus(), vocab_size=64)
  assert len(tok.encode("1234")) == 4
  assert len(tok.encode("12+34=46")) == 8


def test_decode_stops_at_eos_and_skips_pad():
  tok = tok_lib.train_sentencepiece(_corpus(), vocab_size=64)
  ids = [tok.bos_id] + tok.encode("12") + [tok.pad_id] + tok.encode("3") + [tok.eos_id] + tok.encode("9")
  assert tok.decode(ids) == "123"
  assert tok.encode("5", add_bos=True, add_eos=True)[0] == tok.bos_id
  assert tok.encode("5", add_bos=True, add_eos=True)[-1] == tok.eos_id


def test_empty_corpus_raises():
  with pytest.raises(ValueError, match="empty corpus"):
    tok_lib.train_sentencepiece(["", ""])


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_a_vocabulary_too_small_for_the_corpus_is_refused_with_the_size_it_needs(model_type):
  corpus = ["12 + 34 = 46", "what is 3 * 4?"] * 20
  chars = len(set("".join(corpus)))
  needed = chars + tok_lib.NUM_RESERVED
  with pytest.raises(ValueError, match=f"{needed - 1} is too small for this corpus: it needs at "
                     f"least {needed} pieces \\({chars} distinct characters and 4 reserved ids"):
    tok_lib.train_sentencepiece(corpus, vocab_size=needed - 1, model_type=model_type)
  # The count is SentencePiece's own: one piece more and its trainer accepts it.
  assert tok_lib.train_sentencepiece(corpus, vocab_size=needed, model_type=model_type).vocab_size
