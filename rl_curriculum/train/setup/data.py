"""A run's data: the RL pool, the SFT set and the held-out sets (kept apart), and the tokenizer.

  splits = make_splits(task, train_bins=(0, 1, 2, 3, 4, 5), eval_bins=range(12),
                       train_per_bin=2000, sft_per_bin=2000, eval_per_bin=128,
                       held_out_fraction=0.2)
  splits.rl, splits.sft        # [Problem] of the training bins; never a held-out prompt
  splits.held_out[4]           # [Problem] bin 4's held-out set
  splits.sizes[4]              # HeldOutSize(count=15, requested=128, trained=True)

Why prompts and not seeds. Every split draws from its own range of generator seeds, but distinct
seeds do not make distinct prompts: a bin whose whole problem space is small (arithmetic mul_1d_1d
has 64 problems, add_2d_1d 900) is covered entirely by a 2000-problem RL pool, so a seed-disjoint
held-out set of such a bin is memorised training data. Here a fixed partition of every bin's
problem space by a stable hash of the prompt text (`held_out`) decides which prompts are held out:
a training bin draws its RL and SFT problems only among the other prompts and its held-out set
only among these, so no held-out prompt is ever trained on, whatever the bin's size. A small bin
then has fewer held-out problems than asked (about the fraction times its size); `sizes` reports
the count. Bins the run does not train on (evaluation-only bins, or bins left out of train_bins)
draw their held-out sets from the whole space: nothing trains on them.

Validation and test. A second hash of the prompt (`held_out_part`) splits the held-out prompts
of every bin in two fixed halves: `held_out_split="validation"` draws the held-out sets from one,
"test" from the other (each with its own seeds). A sweep chooses its learning rate or temperature
on validation sets and reports test sets that no choice has read (`held_out_sets` builds them
alone, for a finished run); "all" (the default) keeps both halves, as before.

The partition depends only on the prompt text and the fraction: it is the same in every process
and on every machine, and nested (a prompt held out at fraction f is held out at every larger
fraction). Everything here is host-side Python and deterministic in its arguments.

Then the prompts become token pools (`make_pools`): the RL pool with its curriculum arms
(`arms_of`: one per training bin, or on a task mixture one per task), the SFT pool with its target
tokens, and one pool per held-out set, all padded to the longest prompt of the run. On a mixture
(`tasks.MixtureTask`) the RL pool's per-bin sizes may follow mixture weights (`pool_sizes`). A run from scratch trains its SentencePiece tokenizer on its own problems, once per
workdir (`workdir_tokenizer`); a pretrained model brings its own.
"""

import hashlib
import os
import zlib
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from rl_curriculum.model.tokenizer import SentencePieceTokenizer, train_sentencepiece
from rl_curriculum.parallel import distributed
from rl_curriculum.tasks.base import Problem
from rl_curriculum.tasks.data import TaskPool, make_pool
from rl_curriculum.tasks.mixture import MixtureTask
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.setup.errors import fail

__all__ = ["SEED_BASE", "HELD_OUT_PARTS", "BIN_STRIDE", "ARM_LAYOUTS", "Arms", "arms_of", "pool_sizes",
           "HeldOutSize", "Splits", "held_out", "held_out_part", "problems",
           "held_out_sets", "eval_pools", "make_splits", "Pools", "make_pools",
           "prompt_text", "tokenizer_corpus", "workdir_tokenizer", "TOKENIZER_FILE"]

# The file a run from scratch keeps its SentencePiece tokenizer in, in its workdir.
TOKENIZER_FILE = "tokenizer.model"
# Seed offsets that give the RL pool, the SFT set and the held-out sets their own seeds; a bin's
# seeds start BIN_STRIDE * bin above its split's base.
SEED_BASE = {"rl": 0, "sft": 10_000_000, "eval": 20_000_000, "validation": 30_000_000,
             "test": 40_000_000}
# What a run's held-out sets are drawn from (`held_out_part`): the whole held-out part, or one of
# its two hash-disjoint halves, validation (for choices: learning rates, temperatures) and test
# (reported only, never used for a choice).
HELD_OUT_PARTS = ("all", "validation", "test")
BIN_STRIDE = 100_000
# Draws per bin are bounded by this times the number asked for: a bin smaller than the request
# stops there with what it found.
_ATTEMPTS_PER_PROBLEM = 20
# A bin also stops once this many times the draws it took to meet its latest new prompt (and at
# least _STALE_MIN) brought no new prompt: its space is then exhausted in all likelihood (a prompt
# of probability p stays unseen that long with probability exp(-p * gap)), and small bins do not
# spend 20 * per_bin draws (5 s of the scratch setting's 7) on repeats.
_STALE_FACTOR = 2
_STALE_MIN = 2000


# How a run's training bins become the curriculum's arms (`arms_of`).
ARM_LAYOUTS = ("bin", "task")


class Arms(NamedTuple):
  """The curriculum's K arms over a run's training bins."""
  of_bin: tuple     # arm of each training bin, in train_bins order
  names: tuple      # K arm names


def arms_of(task, train_bins: Sequence[int], layout: str = "bin") -> Arms:
  """The arms a category curriculum chooses among.

  "bin": one arm per training bin, named after it. On a task mixture these are (task, bin) pairs
  such as "countdown/n4", the two-dimensional arms of the Self-Evolving Curriculum's multi-domain
  runs (Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning", arXiv:2505.14970).
  "task": on a mixture, one arm per task with a training bin (in the order of its first one),
  named after the task, holding all its training bins: a curriculum over tasks alone.

  Raises:
    ValueError: an unknown layout, or "task" on a task that is not a mixture.
  """
  train_bins = tuple(int(b) for b in train_bins)
  if layout == "bin":
    return Arms(of_bin=tuple(range(len(train_bins))),
                names=tuple(task.bin_names[b] for b in train_bins))
  if layout != "task":
    raise ValueError(f"unknown arm layout {layout!r}; expected one of {ARM_LAYOUTS}")
  if not isinstance(task, MixtureTask):
    raise ValueError(f"arms per task need a mixture of tasks (names joined by '+'), got the "
                     f"single task {task.name!r}")
  names = tuple(dict.fromkeys(task.task_of(b) for b in train_bins))
  return Arms(of_bin=tuple(names.index(task.task_of(b)) for b in train_bins), names=names)


def pool_sizes(task, train_bins: Sequence[int], per_bin: int,
               weights: Sequence[float] = ()) -> dict:
  """{training bin: RL problems to draw}. Without weights every bin gets `per_bin`. With mixture
  weights (one per task of the mixture, `task.task_names` order; relative) the pool keeps its
  size, per_bin x the number of training bins, and task t's share of it is w_t / (the sum of the
  weights of the tasks with training bins), split evenly over t's training bins (rounded, at
  least 1 each).

  Raises:
    ValueError: weights on a task that is not a mixture, not one per task, or not all > 0.
  """
  train_bins = tuple(int(b) for b in train_bins)
  if not weights:
    return {b: int(per_bin) for b in train_bins}
  if not isinstance(task, MixtureTask):
    raise ValueError(f"mixture weights need a mixture of tasks, got the single task "
                     f"{task.name!r}")
  weights = tuple(float(w) for w in weights)
  if len(weights) != len(task.task_names) or min(weights) <= 0:
    raise ValueError(f"need one weight > 0 per task of {task.name} {task.task_names}, got "
                     f"{list(weights)}")
  weight = dict(zip(task.task_names, weights))
  bins_of = {}
  for b in train_bins:
    bins_of.setdefault(task.task_of(b), []).append(b)
  total = per_bin * len(train_bins)
  mass = sum(weight[t] for t in bins_of)
  return {b: max(1, round(total * weight[t] / mass / len(bins_of[t])))
          for b in train_bins for t in (task.task_of(b),)}


class HeldOutSize(NamedTuple):
  """How many held-out problems an evaluation bin has."""
  count: int        # problems in the bin's held-out set
  requested: int    # eval_per_bin
  trained: bool     # the run trains on the bin: its set comes from held-out prompts only


class Splits(NamedTuple):
  """The problems of one run (see the module docstring)."""
  rl: list          # [Problem] RL pool, training bins in train_bins order, seed order inside
  sft: list         # [Problem] SFT set, same order ([] when sft_per_bin is 0)
  held_out: dict    # {eval bin: [Problem]} held-out sets, in eval_bins order
  sizes: dict       # {eval bin: HeldOutSize}

  def describe(self, bin_names: Optional[Sequence[str]] = None) -> str:
    """One line for a log: held-out problems per bin, "name count/requested", trained bins
    marked with "*" (their sets are limited to held-out prompts)."""
    def name(b):
      return bin_names[b] if bin_names is not None else str(b)
    parts = [f"{name(b)}{'*' if s.trained else ''} {s.count}/{s.requested}"
             for b, s in self.sizes.items()]
    return "held out per bin (* = trained on): " + ", ".join(parts)


def held_out(prompt: str, fraction: float) -> bool:
  """Whether `prompt` lies in the held-out part (a `fraction` of every problem space).

  CRC-32 of the prompt's UTF-8 bytes, read as a number in [0, 2**32), below fraction * 2**32.
  Python's `hash` would not do: it is salted per process. Defined for any fraction (0 holds out
  nothing, 1 everything); `make_splits` asks for one strictly between.
  """
  return zlib.crc32(prompt.encode("utf-8")) < fraction * 2**32


def held_out_part(prompt: str) -> str:
  """"validation" or "test": which half of the held-out part `prompt` belongs to.

  The first bit of the SHA-256 digest of the prompt's UTF-8 bytes: 0 "test", 1 "validation". A
  hash unrelated to `held_out`'s CRC-32, so each half is a fixed half of every held-out
  fraction's prompts (and of an evaluation-only bin's whole space), the same in every process;
  the halves share no prompt, and neither shares one with training. (A second CRC-32, of the
  prompt behind a prefix, would not do: CRC is affine in its input, so among prompts of one
  length its top bit would follow `held_out`'s and put every held-out prompt in one half.)
  """
  return "test" if hashlib.sha256(prompt.encode("utf-8")).digest()[0] < 128 else "validation"


def problems(task, bins: Sequence[int], per_bin: int, split: str, *,
             exclude: Optional[Callable[[str], bool]] = None) -> list[Problem]:
  """Up to `per_bin` problems per bin with distinct prompts, from the split's own seeds.

  Bin b draws `task.generate(SEED_BASE[split] + BIN_STRIDE * b + i, b)` for i = 0, 1, ... and
  keeps each new prompt for which `exclude(task.split_key(problem))` is false (the split key: the
  prompt, unless the task says what makes two problems the same), until it has `per_bin` problems,
  has made 20 * per_bin draws, or has gone max(2000, 2 * i_new) draws without a new prompt (kept
  or excluded; i_new = the draw that met the latest one): a bin whose space, less the excluded
  prompts, is smaller than `per_bin` yields fewer. `exclude` must depend on the prompt alone: it
  is asked once per prompt.

  Returns:
    [Problem], the bins in the given order, each bin's problems in seed order.
  Raises:
    ValueError: unknown split, negative per_bin, or a bin outside the task (from task.generate).
  """
  if split not in SEED_BASE:
    raise ValueError(f"unknown split {split!r}; expected one of {sorted(SEED_BASE)}")
  if per_bin < 0:
    raise ValueError(f"per_bin must be >= 0, got {per_bin}")
  out = []
  for b in bins:
    seed = SEED_BASE[split] + BIN_STRIDE * int(b)
    seen = set()  # prompts kept or excluded: a repeated prompt costs a lookup, not a hash
    kept = last_new = 0
    for attempt in range(_ATTEMPTS_PER_PROBLEM * per_bin):
      problem = task.generate(seed + attempt, int(b))
      if problem.prompt in seen:
        if attempt - last_new >= max(_STALE_MIN, _STALE_FACTOR * (last_new + 1)):
          break
        continue
      seen.add(problem.prompt)
      last_new = attempt
      if exclude is not None and exclude(task.split_key(problem)):
        continue
      out.append(problem)
      kept += 1
      if kept == per_bin:
        break
  return out


def _unique(bins: Sequence[int], field: str) -> tuple:
  bins = tuple(int(b) for b in bins)
  if len(set(bins)) != len(bins):
    raise ValueError(f"{field} repeats a bin: {list(bins)}")
  return bins


def make_splits(task, train_bins: Sequence[int], eval_bins: Sequence[int], *,
                train_per_bin: Union[int, Mapping[int, int]], sft_per_bin: int,
                eval_per_bin: int, held_out_fraction: float,
                held_out_split: str = "all") -> Splits:
  """RL pool, SFT set and held-out sets such that no held-out prompt is in the RL pool or SFT set.

  Training bins draw their RL (`train_per_bin` per bin, or {bin: count} as `pool_sizes` gives)
  and SFT (`sft_per_bin`, 0 for none) problems among those with `held_out(key,
  held_out_fraction)` false, key the problem's `Task.split_key` (its prompt, or what the task
  says makes problems the same: a calculator's expression, a game's hidden number, so that no
  held-out problem is a training problem under another id). The held-out sets are `held_out_sets(..., part=held_out_split)`:
  a training bin's among prompts with it true, so a small bin gets fewer (reported in `sizes`,
  never an error); any other evaluation bin's from its whole space; with part "validation" or
  "test", only among that half's prompts (`held_out_part`). Seeds as in `problems` (splits
  "rl", "sft", and "eval", "validation" or "test").

  Raises:
    ValueError: held_out_fraction outside (0, 1); train_per_bin or eval_per_bin below 1, or
      sft_per_bin below 0; a repeated bin; a training bin among task.eval_only_bins; a training
      bin without any RL problem; an evaluation bin without any held-out problem.
  """
  fraction = float(held_out_fraction)
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"held_out_fraction must lie strictly between 0 and 1, got "
                     f"{held_out_fraction}")
  train_bins = _unique(train_bins, "train_bins")
  rl_sizes = (dict(train_per_bin) if isinstance(train_per_bin, Mapping)
              else {b: train_per_bin for b in train_bins})
  if sorted(rl_sizes) != sorted(train_bins):
    raise ValueError(f"train_per_bin names bins {sorted(rl_sizes)}, the training bins are "
                     f"{sorted(train_bins)}")
  smallest = min(rl_sizes.values(), default=1 if isinstance(train_per_bin, Mapping)
                 else train_per_bin)
  if smallest < 1 or eval_per_bin < 1 or sft_per_bin < 0:
    raise ValueError(f"need train_per_bin >= 1, sft_per_bin >= 0 and eval_per_bin >= 1, got "
                     f"{train_per_bin}, {sft_per_bin}, {eval_per_bin}")
  eval_bins = _unique(eval_bins, "eval_bins")
  reserved = sorted(set(train_bins) & set(task.eval_only_bins))
  if reserved:
    raise ValueError(f"training bins {reserved} are evaluation-only bins of {task.name}")

  def is_held_out(prompt):
    return held_out(prompt, fraction)

  rl = [p for b in train_bins
        for p in problems(task, [b], rl_sizes[b], "rl", exclude=is_held_out)]
  sft = problems(task, train_bins, sft_per_bin, "sft", exclude=is_held_out)
  empty = sorted(set(train_bins) - {p.difficulty for p in rl})
  if empty:
    raise ValueError(f"training bins {empty} of {task.name} have no prompt outside the held-out "
                     f"fraction {fraction} (no RL problem); lower held_out_fraction")
  sets, sizes = held_out_sets(task, train_bins, eval_bins, eval_per_bin, fraction,
                              part=held_out_split)
  return Splits(rl=rl, sft=sft, held_out=sets, sizes=sizes)


def held_out_sets(task, train_bins: Sequence[int], eval_bins: Sequence[int], per_bin: int,
                  held_out_fraction: float, *, part: str = "all") -> tuple[dict, dict]:
  """({eval bin: [Problem]}, {eval bin: HeldOutSize}): up to `per_bin` held-out problems per bin.

  A bin in `train_bins` draws among prompts with `held_out(prompt, held_out_fraction)` true, any
  other among its whole space (nothing trains on it). Part "all" keeps every such prompt and
  draws the "eval" seeds; "validation" and "test" keep only the prompts of that half
  (`held_out_part`) and draw their own seeds, so the two sets are disjoint from each other and
  from training, and a run whose choices read the validation sets never saw a test problem.

  Raises:
    ValueError: an unknown part, or an evaluation bin without any held-out problem.
  """
  if part not in HELD_OUT_PARTS:
    raise ValueError(f"unknown held-out part {part!r}; expected one of {HELD_OUT_PARTS}")
  fraction = float(held_out_fraction)
  train_bins = {int(b) for b in train_bins}

  def exclude_for(trained):
    def exclude(prompt):
      outside = trained and not held_out(prompt, fraction)
      return outside or (part != "all" and held_out_part(prompt) != part)
    return exclude

  sets, sizes = {}, {}
  for b in eval_bins:
    trained = int(b) in train_bins
    sets[b] = problems(task, [b], per_bin, "eval" if part == "all" else part,
                       exclude=exclude_for(trained))
    sizes[b] = HeldOutSize(count=len(sets[b]), requested=int(per_bin), trained=trained)
  empty = [b for b in eval_bins if not sets[b]]
  if empty:
    raise ValueError(f"evaluation bins {empty} of {task.name} have no held-out prompt at "
                     f"fraction {fraction} (part {part!r}); raise held_out_fraction or "
                     "evaluate other bins")
  return sets, sizes


def tokenizer_corpus(splits: Splits) -> list[str]:
  """The texts a run's own tokenizer is trained on: every RL and SFT prompt with its target, then
  every held-out prompt (so no evaluation prompt meets an unknown piece)."""
  trained = [p.prompt + p.target for p in splits.rl + splits.sft]
  return trained + [p.prompt for ps in splits.held_out.values() for p in ps]


def workdir_tokenizer(workdir: str, corpus: Sequence[str], vocab_size: int,
                      model_type: str = "unigram") -> SentencePieceTokenizer:
  """The SentencePiece tokenizer of `workdir/tokenizer.model`, trained on `corpus` first if the
  file does not exist (by process 0; every process then loads the same file). `model_type`:
  "unigram" or "bpe" (`train_sentencepiece`)."""
  path = os.path.join(workdir, TOKENIZER_FILE)
  exists = os.path.exists(path)
  distributed.sync("tokenizer: looked")  # every process sees the same `exists`
  if exists:
    return SentencePieceTokenizer.load(path)
  if distributed.is_main():  # one process trains it, the others load that file
    train_sentencepiece(corpus, vocab_size=vocab_size, model_type=model_type).save(path)
  distributed.sync("tokenizer: saved")
  return SentencePieceTokenizer.load(path)


def prompt_text(template: str, task, tok) -> Callable[[Problem], str]:
  """The text a model reads for a problem: the task's prompt ("plain"), or the task's chat
  messages through the tokenizer's chat template ("chat", "chat_short")."""
  if template in ("chat", "chat_short"):
    return lambda problem: tok.apply_chat_template(task.prompt_messages(problem))
  return lambda problem: problem.prompt


class Pools(NamedTuple):
  """The token pools of a run (`make_pools`)."""
  rl: TaskPool                  # the RL pool; arms as `make_pools`'s bin_arms says
  eval_sets: dict               # {bin name: TaskPool} held-out sets, in eval_bins order
  sft: Optional[TaskPool]       # the SFT prompts (None without SFT problems)
  sft_targets: Any              # (tokens i32[N, T], mask f32[N, T]) SFT targets + EOS, or None
  prompt_len: int               # every pool's prompts are left-padded to this length


def make_pools(splits: Splits, task, tok, train_bins: Sequence[int], *,
               template: str = "plain", bin_arms: Optional[Sequence[int]] = None,
               framing: Optional[episodes.Framing] = None, observation_tokens: int = 0) -> Pools:
  """Tokenized pools of `splits`, prompts rendered by `prompt_text(template, task, tok)`.

  The RL pool's arm of training bin train_bins[i] is bin_arms[i] (`arms_of(...).of_bin`; None:
  i). Its scalar difficulty (AdaRFT's) is each problem's bin, on a mixture the bin within the
  problem's own task (so tasks are not ranked by the order they are named in).
  The SFT pool's prompts are rendered alike; its targets are the problems' solving episodes as a
  rollout writes them (`episodes.demonstration_rows`: a single-turn task's target and EOS; an
  environment's turns with its replies between them, framed by `framing` in at most
  `observation_tokens` ids each and given no loss), right-padded to the longest.
  """
  text = prompt_text(template, task, tok)
  held = [p for ps in splits.held_out.values() for p in ps]
  prompt_len = max(len(tok.encode(text(p))) for p in splits.rl + splits.sft + held)

  def pool(problems, **kwargs):
    return make_pool(problems, tok.encode, tok.pad_id, max_prompt_len=prompt_len, **kwargs)

  level = task.local_bin if isinstance(task, MixtureTask) else (lambda b: b)
  rl = pool(splits.rl, bins=train_bins, bin_arms=bin_arms, prompt_fn=text,
            difficulty=[level(p.difficulty) for p in splits.rl])
  eval_sets = eval_pools(splits.held_out, task, tok, template=template, prompt_len=prompt_len)
  sft_pool = sft_targets = None
  if splits.sft:
    sft_pool = pool(splits.sft, bins=train_bins, prompt_fn=text)
    try:
      sft_targets = episodes.demonstration_rows(task, splits.sft, tok, framing=framing,
                                                cap=observation_tokens)
    except NotImplementedError as e:
      fail("sft.steps", f"an SFT warm start imitates solved episodes, and {e}: set sft.steps = 0 "
           "or give the environment a `_solution`")
  return Pools(rl=rl, eval_sets=eval_sets, sft=sft_pool, sft_targets=sft_targets,
               prompt_len=prompt_len)


def eval_pools(held_out: Mapping[int, Sequence[Problem]], task, tok, *, template: str = "plain",
               prompt_len: Optional[int] = None) -> dict:
  """{bin name: TaskPool} of held-out sets ({bin: [Problem]}), prompts rendered by
  `prompt_text(template, task, tok)` and left-padded to `prompt_len` (None: the longest)."""
  text = prompt_text(template, task, tok)
  if prompt_len is None:
    prompt_len = max(len(tok.encode(text(p))) for ps in held_out.values() for p in ps)
  return {task.bin_names[b]: make_pool(ps, tok.encode, tok.pad_id, max_prompt_len=prompt_len,
                                       prompt_fn=text)
          for b, ps in held_out.items()}
