"""Multi-turn episodes: the engine writes turns, the host steps each row's environment between.

  framing = observation_framing(tokenizer, template)     # the fixed text around an observation
  state, played = play(state, run=..., problems=..., limits=Limits(...), ...)
  played.rewards, played.correct, played.turns           # per row: the episode's return, ...
  state, played, again = step_turns(state, generation, ...)   # one round of answers
  outcomes = outcomes_by_bin(graphdef, params, sets, task, tokenizer, ...)   # greedy, held out

An episode is a row of the continuous engine (`sampling.turns`). Each round, the engine decodes
every queued row's turn until it draws a stop id (the chat template's end of a message) or its
turn's token limit; then, on the host, each row whose turn ended hands the text of that turn to
its environment (`environments.base.Environment.step`), whose observation is tokenised once,
framed as one more message of the chat template, and written after the turn (`turns.requeue`);
the row plays on until the environment says done, the turn limit H (`Limits.max_turns`), or its
positions run out (`Limits.max_new_tokens`, turns and observations together: the episode's token
limit, apart from each turn's own, `Limits.turn_tokens`). Token in, token out: a row holds the
ids the policy drew and the observations' ids as they were fed, never a conversation rendered
again.

The host keeps nothing between rounds: environments are pure, so `replay` reads a row's episode
from its buffer (its turns are the runs of drawn positions) and steps its environment again on
each finished turn. A row's episode is therefore wherever its tokens are: in flight across steps,
in a checkpoint, or after a restart.

The episode's return is the sum of its environment's rewards; the group advantages are taken over
the G episodes of a problem as over G completions, and every policy token of an episode gets its
episode's advantage. Observation ids carry mask 0 from the moment they are written, so the loss,
the KL and the entropy never see them.

Shapes: R rows, N positions a row, O observation ids.
"""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum import environments
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import turns
from rl_curriculum.parallel import distributed

__all__ = ["Limits", "Played", "observation_framing", "encode_observation", "replay",
           "step_turns", "play", "episode_stats", "outcomes_by_bin"]

_MARK = "\u2063OBSERVATION\u2063"  # a placeholder no template writes on its own


class Limits(NamedTuple):
  """An episode's bounds."""
  max_turns: int           # H: turns of the policy at most
  turn_tokens: int         # tokens one turn may draw
  observation_tokens: int  # ids one observation may take, its framing included
  max_new_tokens: int      # N: positions of the whole episode (turns and observations)


class Played(NamedTuple):
  """Each row's episode (R rows; a row that was not played has zeros)."""
  rewards: np.ndarray      # f32[R] the return: the sum of the environment's rewards
  correct: np.ndarray      # bool[R] solved
  turns: np.ndarray        # i32[R] turns the policy wrote
  tool_calls: np.ndarray   # i32[R] turns with a tool call
  well_formed: np.ndarray  # i32[R] of them, calls that parsed
  malformed: np.ndarray    # i32[R] turns with neither a well-formed call nor an answer
  cut: np.ndarray          # bool[R] ended by a limit (turns or positions), not by the
                           # environment
  oldest: np.ndarray       # i32[R] the oldest version of the weights that drew a token of the
                           # episode (its first turn's, unless weights changed within a turn)

  def staleness(self, version: int) -> np.ndarray:
    """i32[R]: each played episode's staleness against weights of `version`, that of its oldest
    token (an episode is as stale as the oldest turn that produced it); 0 where none."""
    return np.where(self.turns > 0, version - self.oldest, 0)


def observation_framing(tokenizer, template: str) -> tuple[str, str]:
  """(before, after): the text around an observation, as the chat template writes a user message
  after an assistant turn that ended with its end-of-message token (the policy drew that token;
  the framing holds what the template writes after it). The plain template frames it as a line.

  Raises:
    ValueError: a template that does not write a conversation as a run of its messages.
  """
  if template == "plain":
    return "\n", "\n"
  render = tokenizer.apply_chat_template
  question = [{"role": "user", "content": "Q"}]
  head = render(question, add_generation_prompt=True) + "A"
  full = render(question + [{"role": "assistant", "content": "A"},
                            {"role": "user", "content": _MARK}], add_generation_prompt=True)
  eos = tokenizer.token_text(tokenizer.eos_id)
  if not full.startswith(head + eos) or full.count(_MARK) != 1:
    raise ValueError("the chat template does not write a conversation as its messages one "
                     "after another; episodes need an observation framed as one more message")
  return tuple(full[len(head + eos):].split(_MARK))


def encode_observation(tokenizer, framing: tuple[str, str], text: str, cap: int) -> list[int]:
  """The ids of an observation in its framing, at most `cap` (the text's ids cut first, the
  framing's kept whole, so the next turn always starts where the template starts one)."""
  before, after = (tokenizer.encode(part) for part in framing)
  room = max(cap - len(before) - len(after), 0)
  return before + tokenizer.encode(text)[:room] + after


def _empty(r: int) -> Played:
  return Played(rewards=np.zeros(r, np.float32), correct=np.zeros(r, bool),
                turns=np.zeros(r, np.int32), tool_calls=np.zeros(r, np.int32),
                well_formed=np.zeros(r, np.int32), malformed=np.zeros(r, np.int32),
                cut=np.zeros(r, bool), oldest=np.zeros(r, np.int32))


class _Next(NamedTuple):
  """What a row's episode needs next (`replay`): nothing (decoding, queued, or over), or a
  reply written after its last turn and the row queued again."""
  reply: Optional[list]  # ids to write after the last turn, or None
  start: int            # where they go: one past the last turn's last position


def replay(env, problem, seed: int, row: tuple, done: bool, *, tokenizer, framing,
           limits: Limits, out: Played, i: int) -> _Next:
  """Row i's episode so far, read from its buffer: its environment reset and stepped again on
  the text of each of its finished turns (runs of drawn positions; the last run is a finished
  turn only when the row is `done`), the statistics written into `out` at i, and what it needs
  next. row = (tokens i32[N], mask f32[N], versions i32[N], forced int: positions before it hold
  written replies). Environments are pure, so the buffer alone is the episode's state: nothing
  of it needs keeping between calls, steps or a restart."""
  tokens, mask, versions, forced = row
  drawn = np.flatnonzero(mask > 0)
  runs = np.split(drawn, np.flatnonzero(np.diff(drawn) > 1) + 1) if drawn.size else []
  out.oldest[i] = versions[drawn].min() if drawn.size else 0
  state = env.reset(problem, int(seed))
  n = limits.max_new_tokens
  for k, run in enumerate(runs[:len(runs) if done else len(runs) - 1]):
    end = int(run[-1]) + 1
    state, step = env.step(problem, state, tokenizer.decode(tokens[int(run[0]):end]))
    out.turns[i] += 1
    out.rewards[i] += np.float32(step.reward)
    out.correct[i] |= bool(step.correct)
    out.tool_calls[i] += bool(step.tool_call)
    out.well_formed[i] += bool(step.tool_call and step.well_formed)
    out.malformed[i] += not step.well_formed
    if step.done:
      return _Next(None, end)
    ids = encode_observation(tokenizer, framing, step.observation, limits.observation_tokens)
    if out.turns[i] >= limits.max_turns or end + len(ids) >= n:
      out.cut[i] = True
      return _Next(None, end)
    if k == len(runs) - 1 and forced <= end:  # its reply is not written yet
      return _Next(ids, end)
  return _Next(None, 0)


def step_turns(state, generation: int, *, problems: Sequence[Optional[Any]], task,
               seeds: Sequence[int], tokenizer, framing: tuple[str, str], limits: Limits,
               mesh=None, read_only: bool = False) -> tuple[Any, Played, bool]:
  """(state, `Played` of the generation's rows so far, whether a row was queued again): every
  row of generation `generation` (batch order; problems[r] its problem, None: not played)
  whose turn has ended and whose episode goes on gets its environment's reply and is queued
  again (`turns.requeue`; not with `read_only`); the statistics of a row are final once it is
  done and not queued."""
  r = len(problems)
  rows = jax.tree.map(lambda x: np.asarray(distributed.to_host(x)),
                      turns.rows_of(state, jnp.int32(generation)))
  out = _empty(r)
  again = np.zeros(r, bool)
  observations = np.zeros((r, limits.observation_tokens), np.int32)
  lengths, start, limit = (np.zeros(r, np.int32) for _ in range(3))
  for i in range(r):
    if problems[i] is None:
      continue
    env = environments.environment_for(task, problems[i])
    row = (rows.tokens[i], rows.mask[i], rows.versions[i], int(rows.forced[i]))
    wants = replay(env, problems[i], seeds[i], row, bool(rows.done[i]), tokenizer=tokenizer,
                   framing=framing, limits=limits, out=out, i=i)
    if wants.reply is not None:
      ids = wants.reply
      again[i], lengths[i], start[i] = True, len(ids), wants.start
      observations[i, :len(ids)] = ids
      limit[i] = min(wants.start + len(ids) + limits.turn_tokens, limits.max_new_tokens)
  if again.any() and not read_only:
    state = turns.requeue(state, *(jnp.asarray(x) for x in (again, observations, lengths, start,
                                                            limit)),
                          generation=jnp.int32(generation), mesh=mesh)
  return state, out, bool(again.any())


def play(state, *, run: Callable[[Any], Any], problems: Sequence[Optional[Any]], task,
         seeds: Sequence[int], tokenizer, framing: tuple[str, str], limits: Limits,
         mesh=None, generation: int = 0) -> tuple[Any, Played]:
  """(the engine state after every row's episode, `Played`): the rows of generation
  `generation` queued in `state` (`inflight.admit`, each allowed `limits.turn_tokens` tokens)
  play their episodes: `run(state)` decodes a round of turns, the environments of `task`
  (`environments.environment_for`) step on the host (`step_turns`), and the rows that go on are
  queued again, until none is. problems[r] is row r's problem (None: not played), seeds[r] its
  episode's seed."""
  while True:
    state = run(state)
    state, played, again = step_turns(state, generation, problems=problems, task=task,
                                      seeds=seeds, tokenizer=tokenizer, framing=framing,
                                      limits=limits, mesh=mesh)
    if not again:
      return state, played


def episode_stats(played: Played, valid: np.ndarray) -> dict:
  """The episodes' statistics for the log over the played rows `valid` (bool[R]): turns, the
  share of turns with a tool call, the share of calls that parsed, the share of turns with
  neither a call nor an answer, the share of episodes solved and cut by a limit."""
  v = np.asarray(valid, bool).reshape(-1)
  turns_ = max(int(played.turns[v].sum()), 1)
  calls = int(played.tool_calls[v].sum())
  episodes = max(int(v.sum()), 1)
  return {"episode/turns": float(played.turns[v].sum()) / episodes,
          "episode/tool_call_rate": calls / turns_,
          "episode/well_formed_calls": float(played.well_formed[v].sum()) / max(calls, 1),
          "episode/malformed_turns": float(played.malformed[v].sum()) / turns_,
          "episode/success": float(played.correct[v].sum()) / episodes,
          "episode/cut": float(played.cut[v].sum()) / episodes}


def outcomes_by_bin(graphdef, params, sets, task, tokenizer, *, framing, limits: Limits,
                    batch_size: int, slots: int, page_size: int, stop_ids, pad_id: int,
                    seed: int = 0) -> tuple[dict, dict]:
  """({bin name: (correct bool[n], well-formed bool[n])}, {bin name: `Played`}): each held-out
  problem's greedy episode, in its set's order (`batch_size` episodes a call, the last batch
  padded with the first problem and its outcome dropped); well-formed: no malformed turn."""
  outcomes, played_by_bin = {}, {}
  for name, pool in sets.items():
    parts = []
    for first in range(0, len(pool.problems), batch_size):
      idx = np.arange(first, first + batch_size)
      idx = np.where(idx < len(pool.problems), idx, 0)
      state = inflight.init(graphdef, params, jax.random.PRNGKey(seed), rows=batch_size,
                            generations=1, prompt_len=pool.tokens.shape[1],
                            slots=min(slots, batch_size), max_new_tokens=limits.max_new_tokens,
                            pad_id=pad_id, page_size=page_size,
                            kv_pages=turns.episode_pages(batch_size, limits.max_new_tokens,
                                                         page_size))
      draw = dict(stop_ids=tuple(sorted(set(stop_ids))), pad_id=pad_id, greedy=True)
      state = inflight.admit(graphdef, params, turns.episodic(state),
                             jnp.asarray(pool.tokens[idx]), jnp.asarray(pool.mask[idx]),
                             jax.random.PRNGKey(seed), jnp.int32(0), jnp.float32(1.0),
                             jnp.int32(0), None,
                             jnp.full((batch_size,), limits.turn_tokens, jnp.int32),
                             max_new_tokens=limits.max_new_tokens, **draw)
      step = lambda s: continuous.run(graphdef, params, s, jnp.float32(1.0), **draw)
      problems = [pool.problems[i] if first + j < len(pool.problems) else None
                  for j, i in enumerate(idx)]
      _, played = play(state, run=step, problems=problems, task=task,
                       seeds=[seed + first + j for j in range(batch_size)], tokenizer=tokenizer,
                       framing=framing, limits=limits)
      keep = min(batch_size, len(pool.problems) - first)
      parts.append(jax.tree.map(lambda x: x[:keep], played))
    played = Played(*(np.concatenate(x) for x in zip(*parts)))
    outcomes[name] = (played.correct.copy(), played.malformed == 0)
    played_by_bin[name] = played
  return outcomes, played_by_bin
