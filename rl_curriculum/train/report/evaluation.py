"""Held-out evaluation: greedy accuracy (and pass@k from samples) per difficulty bin, and per
task and skill balance for a run on several tasks.

  held = held_out(graphdef, params, sets, task, tokenizer, framing=..., limits=..., width=...)
  held.outcomes, held.played, held.transcripts        # per bin: (correct, formatted), ...

Every held-out problem plays one greedy episode, as the run plays them (`episodes`): a
single-turn completion is a one-turn episode scored by its task, an environment's episode takes
its turns with the replies between them. Episodes of one turn are sampled whole by the static
sampler; longer ones on the continuous engine whose rows come back after a turn.
"""

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import sampler
from rl_curriculum.sampling import turns
from rl_curriculum.tasks.data import TaskPool
from rl_curriculum.train.rollout import episodes


def generate_texts(graphdef, params, pool: TaskPool, decode: Callable, *, batch_size: int,
                   max_new_tokens: int, eos_id: int, pad_id: int, stop_ids=(),
                   greedy: bool = True, temperature: float = 1.0, key=None,
                   group: int = 1) -> list[str]:
  """Completions for every prompt of `pool`, in fixed-size batches (one compile per shape).

  With `group` > 1 each prompt gets `group` completions, prefilled once (`sampler.sample`'s
  `group`); the result lists them prompt by prompt, len(pool) * group texts. A batch then holds
  max(1, batch_size // group) prompts. The last batch is padded with copies of the first prompt
  whose outputs are dropped.
  """
  n = len(pool.problems)
  prompts = max(1, batch_size // group)
  texts = []
  for start in range(0, n, prompts):
    idx = np.arange(start, start + prompts)
    idx = np.repeat(np.where(idx < n, idx, 0), group)
    k = jax.random.fold_in(key, start) if key is not None else jax.random.PRNGKey(0)
    rollout = sampler.sample(graphdef, params, jnp.asarray(pool.tokens[idx]),
                             jnp.asarray(pool.mask[idx]), k, max_new_tokens=max_new_tokens,
                             eos_id=eos_id, stop_ids=stop_ids, pad_id=pad_id, greedy=greedy,
                             temperature=temperature, group=group)
    tokens = np.asarray(rollout.tokens)
    texts.extend(decode(row) for row in tokens[:min(prompts, n - start) * group])
  return texts


class HeldOut(NamedTuple):
  """Greedy episodes of every held-out set (`held_out`), by bin name."""
  outcomes: dict     # {bin: (correct bool[n], formatted bool[n])}; formatted: no malformed turn
  played: dict       # {bin: episodes.Played of its n problems}
  transcripts: dict  # {bin: [the first few episodes: question, answer, turns, return, correct]}


def _one_turn_rows(graphdef, params, tokens, mask, *, limits, stop_ids, pad_id) -> turns.Rows:
  """Rows of greedy one-turn episodes, sampled whole by the static sampler."""
  rollout = sampler.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                           jax.random.PRNGKey(0), max_new_tokens=limits.max_new_tokens,
                           eos_id=stop_ids[0], stop_ids=stop_ids, pad_id=pad_id, greedy=True)
  return episodes.finished_rows(rollout.tokens, rollout.mask)


def _play_batch(graphdef, params, tokens, mask, problems, seeds, task, tokenizer, *, framing,
                limits, width, slots, page_size, stop_ids, pad_id, seed):
  """(the rows' final state, `episodes.Played`) of greedy episodes of the prompts i32[B, Tp]."""
  options = dict(problems=problems, task=task, seeds=seeds, tokenizer=tokenizer,
                 framing=framing, limits=limits)
  if width == 1:
    rows = _one_turn_rows(graphdef, params, tokens, mask, limits=limits, stop_ids=stop_ids,
                          pad_id=pad_id)
    return rows, episodes.step_turns(rows, 0, read_only=True, width=width,
                                     rows_of=lambda rows, _: rows, **options)[1]
  b = tokens.shape[0]
  draw = dict(stop_ids=tuple(sorted(set(stop_ids))), pad_id=pad_id, greedy=True)
  state = inflight.init(graphdef, params, jax.random.PRNGKey(seed), rows=b, generations=1,
                        prompt_len=tokens.shape[1], slots=min(slots, b),
                        max_new_tokens=limits.max_new_tokens, pad_id=pad_id,
                        page_size=page_size,
                        kv_pages=turns.episode_pages(b, limits.max_new_tokens, page_size))
  state = inflight.admit(graphdef, params, turns.episodic(state), jnp.asarray(tokens),
                         jnp.asarray(mask), jax.random.PRNGKey(seed), jnp.int32(0),
                         jnp.float32(1.0), jnp.int32(0), None,
                         jnp.full((b,), limits.turn_tokens, jnp.int32),
                         max_new_tokens=limits.max_new_tokens, **draw)
  step = lambda s: continuous.run(graphdef, params, s, jnp.float32(1.0), **draw)
  state, played = episodes.play(state, run=step, **options)
  return turns.rows_of(state, jnp.int32(0)), played


def _transcript(task, tokenizer, problem, seed, rows, j, *, framing, limits) -> dict:
  """Row j's episode written out: its question and answer, each turn's text, reward and the
  reply fed after it, the return and whether it was solved."""
  turns_ = []
  out = episodes.empty_played((1,), limits.max_turns)
  row = tuple(np.asarray(x[j]) for x in (rows.tokens, rows.mask, rows.versions, rows.forced))
  episodes.replay(task, problem, seed, row[:3] + (int(row[3]),), True, tokenizer=tokenizer,
                  framing=framing, limits=limits, out=out, i=0, transcript=turns_)
  return {"question": problem.question, "answer": problem.answer, "turns": turns_,
          "return": float(out.rewards[0]), "correct": bool(out.correct[0])}


def held_out(graphdef, params, sets: Mapping[str, TaskPool], task, tokenizer, *, framing,
             limits, width: int, batch_size: int, slots: int, page_size: int, stop_ids,
             pad_id: int, transcripts: int = 0, seed: int = 0) -> HeldOut:
  """Each held-out problem's greedy episode, in its set's order (`batch_size` episodes a call,
  the last batch padded with the first problem and its outcome dropped), under `limits` for
  episodes of at most `width` turns; the first `transcripts` of each set written out.
  stop_ids: the ids that end a turn, EOS first."""
  outcomes, played_by_bin, shown = {}, {}, {}
  for name, pool in sets.items():
    parts, shown[name] = [], []
    n = len(pool.problems)
    for first in range(0, n, batch_size):
      idx = np.arange(first, first + batch_size)
      idx = np.where(idx < n, idx, 0)
      problems = [pool.problems[i] if first + j < n else None for j, i in enumerate(idx)]
      seeds = [seed + first + j for j in range(batch_size)]
      rows, played = _play_batch(graphdef, params, pool.tokens[idx], pool.mask[idx], problems,
                                 seeds, task, tokenizer, framing=framing, limits=limits,
                                 width=width, slots=slots, page_size=page_size,
                                 stop_ids=stop_ids, pad_id=pad_id, seed=seed)
      keep = min(batch_size, n - first)
      for j in range(min(transcripts - len(shown[name]), keep)):
        shown[name].append(_transcript(task, tokenizer, problems[j], seeds[j], rows, j,
                                       framing=framing, limits=limits))
      parts.append(jax.tree.map(lambda x: x[:keep], played))
    played = episodes.Played(*(np.concatenate(x) for x in zip(*parts)))
    outcomes[name] = (played.correct.copy(), played.malformed == 0)
    played_by_bin[name] = played
  return HeldOut(outcomes=outcomes, played=played_by_bin, transcripts=shown)


def accuracy(outcomes: Mapping[str, tuple]) -> dict:
  """{bin name: share of correct answers} of held-out outcomes (`HeldOut.outcomes`)."""
  return {name: float(np.mean(correct)) for name, (correct, _) in outcomes.items()}


def task_accuracy(accuracy: Mapping[str, float], sizes: Mapping[str, int],
                  trained: Sequence[str]) -> dict:
  """{task: accuracy} of a run on several tasks from its {bin name: accuracy}, bins named
  "task/bin" (`MixtureTask`): the share of correct answers over the held-out problems (`sizes`:
  {bin name: problems}) of the task's evaluated bins that the run trains on (`trained`), or of all
  its evaluated bins when it trains on none of them. Bins without a "/" belong to no task."""
  tasks: dict = {}
  for name in accuracy:
    if "/" in name:
      tasks.setdefault(name.split("/", 1)[0], []).append(name)
  out = {}
  for task, names in tasks.items():
    names = [n for n in names if n in trained] or names
    count = sum(sizes[n] for n in names)
    out[task] = sum(accuracy[n] * sizes[n] for n in names) / count
  return out


def skill_balance(now: Mapping[str, float], before: Mapping[str, float]) -> dict:
  """How evenly a run on several tasks improved them, from {task: accuracy} now and before RL:
  `min_gain`, the smallest accuracy gain over the tasks (negative: some task got worse), and
  `spread`, the largest minus the smallest task accuracy now."""
  gains = [now[t] - before[t] for t in now]
  return {"min_gain": min(gains), "spread": max(now.values()) - min(now.values())}


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased pass@k estimator (Chen et al. 2021): 1 - C(n - c, k) / C(n, k)."""
  if k > num_samples:
    raise ValueError(f"k={k} > samples={num_samples}")
  if num_samples - num_correct < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(num_samples - num_correct + 1, num_samples + 1)))


def sampled_pass_at_k(graphdef, params, pool: TaskPool, task, decode: Callable, *, k: int,
                      samples: int, batch_size: int, max_new_tokens: int, eos_id: int,
                      pad_id: int, temperature: float, key: Any, stop_ids=()) -> float:
  """Mean pass@k over the pool's prompts from `samples` sampled completions each.

  The samples of a prompt are drawn in one batch that prefills the prompt once.
  """
  texts = generate_texts(graphdef, params, pool, decode, batch_size=batch_size,
                         max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                         stop_ids=stop_ids, greedy=False, temperature=temperature, key=key,
                         group=samples)
  problems = [p for p in pool.problems for _ in range(samples)]
  correct = np.asarray(task.score_batch(problems, texts)[1], bool).reshape(-1, samples)
  return float(np.mean([pass_at_k(samples, int(c), k) for c in correct.sum(axis=1)]))
