"""Held-out evaluation: greedy accuracy (and pass@k from samples) per difficulty bin, and per
task and skill balance for a run on several tasks."""

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.sampling import sampler
from rl_curriculum.tasks.data import TaskPool


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


def outcomes_by_bin(graphdef, params, sets: Mapping[str, TaskPool], task, decode: Callable, *,
                    batch_size: int, max_new_tokens: int, eos_id: int, pad_id: int,
                    stop_ids=()) -> dict:
  """{bin name: (correct bool[n], formatted bool[n])}: each held-out problem's greedy outcome, in
  its set's order; formatted says whether the answer parsed under the task's template."""
  out = {}
  for name, pool in sets.items():
    texts = generate_texts(graphdef, params, pool, decode, batch_size=batch_size,
                           max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                           stop_ids=stop_ids)
    _, correct, formatted = task.score_batch(pool.problems, texts)
    out[name] = (np.asarray(correct, bool), np.asarray(formatted, bool))
  return out


def accuracy_by_bin(graphdef, params, sets: Mapping[str, TaskPool], task, decode: Callable, *,
                    batch_size: int, max_new_tokens: int, eos_id: int, pad_id: int,
                    stop_ids=()) -> dict:
  """{bin name: greedy accuracy in [0, 1]} over each held-out set (`outcomes_by_bin`)."""
  outcomes = outcomes_by_bin(graphdef, params, sets, task, decode, batch_size=batch_size,
                             max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                             stop_ids=stop_ids)
  return accuracy(outcomes)


def accuracy(outcomes: Mapping[str, tuple]) -> dict:
  """{bin name: share of correct answers} of `outcomes_by_bin`'s outcomes."""
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
