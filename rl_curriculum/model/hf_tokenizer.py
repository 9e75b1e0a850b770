"""Tokenizers of pretrained checkpoints, built with the HF `tokenizers` library.

`HFTokenizer` has the interface of `tokenizer.SentencePieceTokenizer` (encode, decode, vocab_size,
pad_id, bos_id, eos_id) plus what instruct models need: `stop_ids` (every end-of-turn id) and
`apply_chat_template` / `encode_chat`. It is built from

  - an HF folder: `tokenizer.json`, with special tokens and the chat template from
    `tokenizer_config.json` (or `chat_template.jinja`) and extra stop ids from
    `generation_config.json`  -> `HFTokenizer.from_folder(folder)`;
  - GGUF metadata (`tokenizer.ggml.*` keys, as in `gguf_io.read_gguf(path).metadata`)
    -> `tokenizer_from_gguf(metadata)`. Only byte-level BPE vocabularies (`tokenizer.ggml.model`
    = "gpt2": SmolLM2, Llama 3, Qwen) are supported.

Chat templates are rendered with jinja2 in a sandbox when it is installed (the checkpoint's own
template, exactly as transformers renders it); without jinja2, ChatML and Llama-3 headers are
written directly.

Example (SmolLM2-Instruct):

  tok = HFTokenizer.from_folder("/path/to/checkpoint")
  ids = tok.encode_chat([{"role": "user", "content": "What is 2+3?"}])
  # '<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nWhat is 2+3?<|im_end|>\\n'
  # '<|im_start|>assistant\\n'
"""

import json
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

# Pre-tokenizer split patterns of byte-level BPE vocabularies, keyed by GGUF `tokenizer.ggml.pre`
# (llama.cpp's names; GPT-2's own is the tokenizers library's ByteLevel split). The merges were
# learned on text split this way, so encoding must split the same way.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GGUF pre-tokenizer name -> (digits split one by one first, split regex or None for GPT-2's).
# SmolLM2's own tokenizer.json splits every digit before the GPT-2 byte-level split.
GGUF_PRE_TOKENIZERS = {
    "default": (False, None),
    "gpt2": (False, None),
    "smollm": (True, None),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}

# GGUF token types (llama.cpp `llama_token_type`).
_CONTROL, _USER_DEFINED = 3, 4


def _token_content(value) -> Optional[str]:
  """A special token from tokenizer_config.json: a string, {"content": ...} or null."""
  if isinstance(value, Mapping):
    return value.get("content")
  return value


class HFTokenizer:
  """Encodes text to ids and back with an HF `tokenizers.Tokenizer`; see the module docstring.

  Attributes:
    tokenizer: the `tokenizers.Tokenizer` (no post-processor: BOS/EOS are added by `encode`).
    chat_template: the checkpoint's jinja chat template, or None.
  """

  def __init__(self, tokenizer: tokenizers.Tokenizer, *, eos_id: int, bos_id: Optional[int] = None,
               pad_id: Optional[int] = None, stop_ids: Sequence[int] = (),
               chat_template: Optional[str] = None, add_bos: bool = False):
    """Args:
      tokenizer: the HF tokenizer; its post-processor is removed (special tokens are explicit).
      eos_id: end of sequence (for instruct models, the end-of-turn token).
      bos_id: beginning of sequence, None when the checkpoint has none (Qwen).
      pad_id: padding id; None means eos_id (the usual choice for checkpoints without one).
      stop_ids: further ids that end a completion (e.g. Llama 3's <|end_of_text|>).
      chat_template: jinja template of the checkpoint, or None.
      add_bos: whether the checkpoint expects BOS before every text (`encode_chat` uses it).
    """
    self.tokenizer = tokenizer
    self.tokenizer.post_processor = None
    self._eos_id = int(eos_id)
    self._bos_id = None if bos_id is None else int(bos_id)
    self._pad_id = self._eos_id if pad_id is None else int(pad_id)
    self.stop_ids = tuple(sorted({self._eos_id, *(int(i) for i in stop_ids)}))
    self.chat_template = chat_template
    self.add_bos = bool(add_bos)

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def bos_id(self) -> Optional[int]:
    return self._bos_id

  @property
  def eos_id(self) -> int:
    return self._eos_id

  def token_to_id(self, token: str) -> Optional[int]:
    return self.tokenizer.token_to_id(token)

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Returns the ids of `text`, optionally framed by BOS and EOS.

    Special-token strings in the text (e.g. "<|im_start|>") become their ids.

    Raises:
      ValueError: add_bos for a checkpoint without a BOS token.
    """
    ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
    if add_bos:
      if self._bos_id is None:
        raise ValueError("this tokenizer has no BOS token; call encode(..., add_bos=False).")
      ids = [self._bos_id] + ids
    if add_eos:
      ids = ids + [self._eos_id]
    return ids

  def encode_text(self, text: str) -> list[int]:
    """The ids of `text` read as plain text: a special-token string in it ("<|im_start|>") is
    spelled out in ordinary pieces, never given the special id. For text that is not the
    model's own (an environment's reply quoting the policy), so that no text can write a chat
    template's markers."""
    self.tokenizer.encode_special_tokens = True
    try:
      return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
    finally:
      self.tokenizer.encode_special_tokens = False

  def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
    """Returns the text of `ids`, stopping at the first stop id (EOS included, not written).

    Leading pad ids (left padding) are dropped first, so a left-padded prompt decodes even when
    pad_id == eos_id (SmolLM2). Ids outside the vocabulary (a model vocabulary padded beyond the
    tokenizer's) are skipped, as are special tokens unless skip_special_tokens=False.
    """
    out = []
    stops = set(self.stop_ids)
    size = self.vocab_size
    leading = True
    for i in ids:
      i = int(i)
      if leading and i == self._pad_id:
        continue
      leading = False
      if i in stops:
        break
      if 0 <= i < size:
        out.append(i)
    return self.tokenizer.decode(out, skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *,
                          add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """The chat rendered as text: the checkpoint's template, or ChatML / Llama 3 headers.

    Args:
      messages: [{"role": "system" | "user" | "assistant", "content": str}, ...].
      add_generation_prompt: end with the header of an assistant turn.
      **kwargs: extra template variables (e.g. enable_thinking for Qwen3).

    Raises:
      ValueError: no template and the vocabulary has neither ChatML nor Llama-3 markers.
    """
    if self.chat_template is not None:
      rendered = _render_jinja(self.chat_template, messages, add_generation_prompt,
                               bos_token=self._special_text(self._bos_id),
                               eos_token=self._special_text(self._eos_id), **kwargs)
      if rendered is not None:
        return rendered
    if self.token_to_id("<|im_start|>") is not None:
      return render_chatml(messages, add_generation_prompt)
    if self.token_to_id("<|start_header_id|>") is not None:
      bos = self._special_text(self._bos_id) or ""
      return render_llama3(messages, add_generation_prompt, bos_token=bos)
    raise ValueError("this tokenizer has no chat template and no ChatML or Llama 3 markers; "
                     "format the prompt as plain text instead.")

  def encode_chat(self, messages: Sequence[Mapping[str, str]], *,
                  add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
    """Ids of the rendered chat. BOS is prepended when the checkpoint adds one and the template
    did not already write it."""
    text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                    **kwargs)
    ids = self.encode(text)
    if self.add_bos and self._bos_id is not None and (not ids or ids[0] != self._bos_id):
      ids = [self._bos_id] + ids
    return ids

  def token_text(self, token_id: int) -> str:
    """One token's text as the vocabulary writes it, a special token's marker included."""
    return self.tokenizer.id_to_token(int(token_id)) or ""

  def _special_text(self, token_id: Optional[int]) -> Optional[str]:
    return None if token_id is None else self.tokenizer.id_to_token(token_id)

  # -------------------------------------------------------------------------------------------
  # Files.

  def save(self, folder: str) -> None:
    """Writes tokenizer.json and tokenizer_config.json (readable by `from_folder` and by
    transformers' AutoTokenizer)."""
    os.makedirs(folder, exist_ok=True)
    self.tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": self._special_text(self._bos_id),
        "eos_token": self._special_text(self._eos_id),
        "pad_token": self._special_text(self._pad_id),
        "add_bos_token": self.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    if self.chat_template is not None:
      config["chat_template"] = self.chat_template
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
      json.dump(config, f, indent=2)

  @classmethod
  def from_folder(cls, folder: str) -> "HFTokenizer":
    """Reads an HF tokenizer folder (tokenizer.json required).

    Raises:
      FileNotFoundError: no tokenizer.json in the folder (the message lists what is there).
    """
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"{folder} has no tokenizer.json (files: {sorted(os.listdir(folder))}); copy the "
          "checkpoint's tokenizer files next to its config.json.")
    tok = tokenizers.Tokenizer.from_file(path)
    config = _read_json(os.path.join(folder, "tokenizer_config.json")) or {}
    # Some checkpoints keep special tokens only in special_tokens_map.json.
    special_map = _read_json(os.path.join(folder, "special_tokens_map.json")) or {}
    generation = _read_json(os.path.join(folder, "generation_config.json")) or {}
    model_config = _read_json(os.path.join(folder, "config.json")) or {}

    def special_id(name: str) -> Optional[int]:
      text = _token_content(config.get(name)) or _token_content(special_map.get(name))
      if text is None:
        return None
      token_id = tok.token_to_id(text)
      if token_id is None:
        raise ValueError(f"{folder}: {name} {text!r} is not in tokenizer.json's vocabulary.")
      return token_id

    eos_id = special_id("eos_token")
    gen_eos = generation.get("eos_token_id", model_config.get("eos_token_id"))
    gen_eos = [] if gen_eos is None else ([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    if eos_id is None:
      if not gen_eos:
        raise ValueError(f"{folder}: no eos_token in tokenizer_config.json and no eos_token_id in "
                         "generation_config.json / config.json; add one.")
      eos_id = gen_eos[0]
    bos_id = special_id("bos_token")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
      named = {t.get("name"): t.get("template") for t in template}
      template = named.get("default") or next(iter(named.values()), None)
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if template is None and os.path.isfile(jinja_path):
      with open(jinja_path) as f:
        template = f.read()
    add_bos = config.get("add_bos_token")
    if add_bos is None:
      # Llama 3 style: no flag, BOS comes from tokenizer.json's post-processor.
      add_bos = bos_id is not None and tok.encode("", add_special_tokens=True).ids[:1] == [bos_id]
    return cls(tok, eos_id=eos_id, bos_id=bos_id, pad_id=special_id("pad_token"),
               stop_ids=gen_eos, chat_template=template, add_bos=bool(add_bos))


def _read_json(path: str) -> Optional[dict]:
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


# ---------------------------------------------------------------------------------------------
# GGUF metadata.


def tokenizer_from_gguf(metadata: Mapping[str, Any]) -> HFTokenizer:
  """Builds the tokenizer a GGUF file describes from its `tokenizer.*` metadata.

  Byte-level BPE: the vocabulary `tokenizer.ggml.tokens` (already in GPT-2's byte-to-unicode
  spelling), the ranked `tokenizer.ggml.merges`, a pre-tokenizer chosen by `tokenizer.ggml.pre`
  (GGUF_PRE_TOKENIZERS), control tokens (type 3) as special tokens, user-defined ones (type 4) as
  added tokens; BOS/EOS/pad from `tokenizer.ggml.*_token_id`; chat template from
  `tokenizer.chat_template`.

  Raises:
    ValueError: a tokenizer model other than "gpt2" (byte-level BPE) or an unknown pre-tokenizer;
      the message lists the supported ones.
  """
  kind = metadata.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; only byte-level BPE "
                     "('gpt2': SmolLM2, Llama 3, Qwen2/3) is. Use the HF folder's tokenizer.json.")
  pre = metadata.get("tokenizer.ggml.pre", "default")
  if pre not in GGUF_PRE_TOKENIZERS:
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
                     f"{sorted(GGUF_PRE_TOKENIZERS)}.")
  tokens = list(metadata["tokenizer.ggml.tokens"])
  vocab = {token: i for i, token in enumerate(tokens)}
  merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
  # Llama 3's tokenizer.json sets ignore_merges: a word already in the vocabulary is one token.
  ignore_merges = pre in ("llama-bpe", "llama3")
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges,
                                        fuse_unk=False))
  split_digits, pattern = GGUF_PRE_TOKENIZERS[pre]
  steps = []
  if split_digits:
    steps.append(pre_tokenizers.Digits(individual_digits=True))
  if pattern is None:
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
  else:
    steps.append(pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
  tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
  tok.decoder = decoders.ByteLevel()
  types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, kind_ in zip(tokens, types) if kind_ == _CONTROL])
  user = [tokenizers.AddedToken(t, special=False, normalized=False)
          for t, kind_ in zip(tokens, types) if kind_ == _USER_DEFINED]
  if user:
    tok.add_tokens(user)

  def get_id(key):
    value = metadata.get(f"tokenizer.ggml.{key}")
    return None if value is None else int(value)

  eos_id = get_id("eos_token_id")
  if eos_id is None:
    raise ValueError("GGUF metadata has no tokenizer.ggml.eos_token_id.")
  stop_ids = [i for i in (get_id("eot_token_id"), get_id("eom_token_id")) if i is not None]
  return HFTokenizer(tok, eos_id=eos_id, bos_id=get_id("bos_token_id"),
                     pad_id=get_id("padding_token_id"), stop_ids=stop_ids,
                     chat_template=metadata.get("tokenizer.chat_template"),
                     add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)))


# ---------------------------------------------------------------------------------------------
# Chat templates.


def render_chatml(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
  """ChatML (SmolLM2, Qwen): `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
  `<|im_start|>assistant\\n` when add_generation_prompt. Adds no default system message."""
  text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render_llama3(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool, *,
                  bos_token: str = "<|begin_of_text|>") -> str:
  """Llama 3 headers: BOS, then `<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}
  <|eot_id|>` per message (content stripped), then the assistant header when asked."""
  text = bos_token + "".join(
      f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
      for m in messages)
  if add_generation_prompt:
    text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
  return text


def _render_jinja(template: str, messages, add_generation_prompt: bool, **variables
                  ) -> Optional[str]:
  """The template rendered like transformers does (sandboxed, trim_blocks, lstrip_blocks), or
  None when jinja2 is not installed."""
  try:
    import jinja2  # pylint: disable=import-outside-toplevel
    from jinja2 import sandbox  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  return env.from_string(template).render(
      messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
      **{k: v for k, v in variables.items() if v is not None})
