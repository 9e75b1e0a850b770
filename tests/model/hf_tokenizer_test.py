"""Tests of rl_curriculum/model/hf_tokenizer.py on small byte-level BPE tokenizers made here."""

import json

import pytest
import tokenizers
import tokenizers.processors
from tokenizers import decoders, models, pre_tokenizers, trainers

from rl_curriculum.model import hf_tokenizer
from rl_curriculum.model.hf_tokenizer import HFTokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CORPUS = ["What is 12 plus 34? The answer is 46.", "Hello world, hello there!",
          "The quick brown fox jumps over the lazy dog.", "user assistant system content",
          "naïve café 漢字 emoji 🙂 tabs\tand\nnew lines"] * 20
TEXTS = ["What is 12+34?", "  leading spaces and trailing  ", "naïve café 漢字 🙂",
         "<|im_start|>user\nhi<|im_end|>\n", "line\n\nbreaks\tand tabs", ""]
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                   "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
MESSAGES = [{"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And 4+4?"}]


def _train(split_digits=True, specials=SPECIALS, vocab_size=320):
  tok = tokenizers.Tokenizer(models.BPE())
  steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
  if split_digits:
    steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
  tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(CORPUS, trainer)
  return tok


@pytest.fixture(scope="module")
def base_tokenizer():
  return _train()


def _chatml(tok, **kwargs):
  return HFTokenizer(tokenizers.Tokenizer.from_str(tok.to_str()), eos_id=2, bos_id=1,
                     **kwargs)


def test_encode_decode_round_trip(base_tokenizer):
  tok = _chatml(base_tokenizer)
  for text in TEXTS:
    if "<|" in text:
      continue  # special tokens are dropped by decode
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_stay_whole_and_frame_on_request(base_tokenizer):
  tok = _chatml(base_tokenizer)
  ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
  assert ids[0] == 1 and ids[-1] == 2
  plain = tok.encode("hi")
  assert tok.encode("hi", add_bos=True, add_eos=True) == [1] + plain + [2]
  assert tok.pad_id == tok.eos_id == 2  # no pad token: EOS pads
  assert tok.vocab_size == base_tokenizer.get_vocab_size()


def test_decode_stops_at_the_first_stop_id_and_skips_out_of_range_ids(base_tokenizer):
  tok = _chatml(base_tokenizer, stop_ids=(0,))
  hello = tok.encode("hello")
  assert tok.decode(hello + [2] + tok.encode(" more")) == "hello"
  assert tok.decode(hello + [0] + tok.encode(" more")) == "hello"
  assert tok.decode(hello + [tok.vocab_size + 5]) == "hello"
  assert tok.stop_ids == (0, 2)
  assert tok.decode([2, 2] + hello + [2, 2]) == "hello"  # left padding with pad == eos


def test_no_bos_refuses_add_bos(base_tokenizer):
  tok = HFTokenizer(base_tokenizer, eos_id=2)
  assert tok.bos_id is None
  with pytest.raises(ValueError, match="no BOS"):
    tok.encode("x", add_bos=True)


def test_chatml_template_renders_like_the_direct_form(base_tokenizer):
  tok = _chatml(base_tokenizer, chat_template=CHATML_TEMPLATE)
  for add in (True, False):
    expected = hf_tokenizer.render_chatml(MESSAGES, add)
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=add) == expected
  assert hf_tokenizer.render_chatml(MESSAGES[1:2], True) == (
      "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
  ids = tok.encode_chat(MESSAGES[1:2])
  assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=False).startswith("<|im_start|>user")


def test_without_a_template_chatml_markers_pick_chatml(base_tokenizer):
  tok = _chatml(base_tokenizer)
  assert tok.apply_chat_template(MESSAGES) == hf_tokenizer.render_chatml(MESSAGES, True)


def test_llama3_template_renders_like_the_direct_form():
  specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
              "<|end_header_id|>", "<|eot_id|>"]
  base = _train(specials=specials)
  tok = HFTokenizer(base, bos_id=0, eos_id=4, stop_ids=(1,), chat_template=LLAMA3_TEMPLATE)
  expected = hf_tokenizer.render_llama3(MESSAGES, True)
  assert expected.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                             "Answer with a number.<|eot_id|>")
  assert tok.apply_chat_template(MESSAGES) == expected
  no_template = HFTokenizer(base, bos_id=0, eos_id=4)
  assert no_template.apply_chat_template(MESSAGES) == expected


def test_no_template_and_no_markers_raises():
  tok = HFTokenizer(_train(specials=["<eos>"]), eos_id=0)
  with pytest.raises(ValueError, match="no chat template"):
    tok.apply_chat_template(MESSAGES)


def test_folder_round_trip(tmp_path, base_tokenizer):
  tok = _chatml(base_tokenizer, chat_template=CHATML_TEMPLATE, add_bos=False)
  tok.save(str(tmp_path))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
  back = HFTokenizer.from_folder(str(tmp_path))
  assert (back.bos_id, back.eos_id, back.pad_id, back.stop_ids) == (1, 2, 2, (0, 2))
  assert back.chat_template == CHATML_TEMPLATE
  for text in TEXTS:
    assert back.encode(text) == tok.encode(text)


def test_folder_reads_dict_tokens_and_template_files(tmp_path, base_tokenizer):
  base_tokenizer.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({
      "eos_token": {"content": "<|im_end|>", "special": True}, "pad_token": "<|endoftext|>"}))
  (tmp_path / "chat_template.jinja").write_text(CHATML_TEMPLATE)
  tok = HFTokenizer.from_folder(str(tmp_path))
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (None, 2, 0)
  assert tok.chat_template == CHATML_TEMPLATE


def test_folder_bos_from_the_post_processor(tmp_path, base_tokenizer):
  """Llama 3 style: no add_bos_token flag, BOS added by tokenizer.json's post-processor."""
  with_bos = tokenizers.Tokenizer.from_str(base_tokenizer.to_str())
  with_bos.post_processor = tokenizers.processors.TemplateProcessing(
      single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
  with_bos.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}))
  tok = HFTokenizer.from_folder(str(tmp_path))
  assert tok.add_bos and tok.bos_id == 0
  assert tok.encode("hi") == base_tokenizer.encode("hi").ids  # encode adds BOS only on request
  assert tok.encode("hi", add_bos=True) == [0] + base_tokenizer.encode("hi").ids
  assert tok.encode_chat(MESSAGES[1:2])[:2] == [0, 1]  # BOS, then <|im_start|>
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False}))
  assert not HFTokenizer.from_folder(str(tmp_path)).add_bos


def test_folder_errors_say_what_is_missing(tmp_path, base_tokenizer):
  with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
    HFTokenizer.from_folder(str(tmp_path))
  base_tokenizer.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="eos"):
    HFTokenizer.from_folder(str(tmp_path))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<missing>"}))
  with pytest.raises(ValueError, match="not in tokenizer.json"):
    HFTokenizer.from_folder(str(tmp_path))


def _gguf_metadata(tok, pre="smollm"):
  """The tokenizer.* metadata llama.cpp's converter writes for a byte-level BPE tokenizer."""
  spec = json.loads(tok.to_str())
  vocab = spec["model"]["vocab"]
  tokens = sorted(vocab, key=vocab.get)
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
  specials = {t["content"] for t in spec["added_tokens"]}
  return {
      "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
      "tokenizer.ggml.token_type": [3 if t in specials else 1 for t in tokens],
      "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
      "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2,
      "tokenizer.chat_template": CHATML_TEMPLATE,
  }


@pytest.mark.parametrize("split_digits", [True, False])
def test_gguf_metadata_tokenizer_encodes_like_the_original(split_digits):
  original = _train(split_digits=split_digits)
  tok = hf_tokenizer.tokenizer_from_gguf(
      _gguf_metadata(original, pre="smollm" if split_digits else "gpt2"))
  for text in TEXTS + CORPUS[:5]:
    assert tok.encode(text) == original.encode(text, add_special_tokens=False).ids, text
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)
  assert tok.apply_chat_template(MESSAGES) == hf_tokenizer.render_chatml(MESSAGES, True)


def test_smollm_pre_tokenizer_splits_digits():
  tok = hf_tokenizer.tokenizer_from_gguf(_gguf_metadata(_train(split_digits=False),
                                                       pre="smollm"))
  pieces = [tok.tokenizer.id_to_token(i) for i in tok.encode("12 plus 34")]
  assert pieces[:2] == ["1", "2"]


def test_gguf_unsupported_tokenizers_list_the_supported_ones(base_tokenizer):
  metadata = _gguf_metadata(base_tokenizer)
  with pytest.raises(ValueError, match="gpt2"):
    hf_tokenizer.tokenizer_from_gguf(dict(metadata, **{"tokenizer.ggml.model": "llama"}))
  with pytest.raises(ValueError, match="smollm"):
    hf_tokenizer.tokenizer_from_gguf(dict(metadata, **{"tokenizer.ggml.pre": "mystery"}))


@pytest.mark.interop
def test_saved_folder_encodes_and_renders_like_transformers(tmp_path, base_tokenizer):
  transformers = pytest.importorskip("transformers")
  tok = _chatml(base_tokenizer, chat_template=CHATML_TEMPLATE)
  tok.save(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  for text in TEXTS:
    assert tok.encode(text) == theirs.encode(text, add_special_tokens=False), text
  assert theirs.eos_token_id == 2 and theirs.bos_token_id == 1
  assert tok.apply_chat_template(MESSAGES) == theirs.apply_chat_template(
      MESSAGES, tokenize=False, add_generation_prompt=True)
