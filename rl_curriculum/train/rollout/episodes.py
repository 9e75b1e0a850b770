"""Episodes: the engine writes turns, the host answers each ended turn with its task's step.

  framing = make_framing(tokenizer, template)             # the ids around an observation
  state, played = play(state, run=..., problems=..., limits=Limits(...), ...)
  played.rewards, played.turn_rewards, played.turns      # per row: the return, each turn's, ...
  state, played, again = step_turns(state, generation, ...)   # one round of answers

Every rollout row is an episode of its problem (`tasks.base.Task`'s reset, step, max_turns). A
single-turn completion is an episode of one turn: its task's `step` scores the text and ends it.
An environment answers a turn with an observation instead and plays on. Each round, the engine
decodes every queued row's turn until it draws a stop id (the chat template's end of a message)
or its turn's token limit; then, on the host, each row whose turn ended hands the text of that
turn to its task's `step`, whose observation is tokenised once, framed as one more message of
the chat template, and written after the turn (`turns.requeue`); the row plays on until the
episode is done, its turn limit (the smaller of the batch's horizon `Limits.max_turns` and the
problem's own `max_turns`), or its positions run out (`Limits.max_new_tokens`, turns and
observations together: the episode's token limit, apart from each turn's own,
`Limits.turn_tokens`). Token in, token out: a row holds the ids the policy drew and the
observations' ids as they were fed, never a conversation rendered again.

Observations (`observation_ids`). A turn the token limit cut before its end-of-turn id is closed
with that id (mask 0) before the reply, so that every row is what the chat template writes for
its conversation. The reply's text is read as plain text (`encode_text`: a policy that spells
"<|im_start|>" in its turn never gets the marker's id back), and one longer than the cap
(`Limits.observation_tokens`, its framing included) loses its middle, head and tail kept, so a
tool's value at the end survives; `episode/obs_cut` counts the cut ones. A cap too small for
the framing is refused before anything compiles (`check_observation_cap`).

The host keeps nothing between rounds: tasks are pure, so `replay` reads a row's episode from its
buffer (its turns are the runs of drawn positions) and steps its task again on each finished
turn. A row's episode is therefore wherever its tokens are: in flight across steps, in a
checkpoint, or after a restart.

The episode's return is the sum of its turns' rewards (`Played.turn_rewards` keeps each); the
group advantages are taken over the G episodes of a problem, and the learn step puts them on every
drawn token of an episode (`rl.credit`). Observation ids carry mask 0 from the moment they are
written, so the loss, the KL and the entropy never see them.

Shapes: R rows, N positions a row, O observation ids, H turns at most (the run's turn width).
"""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.parallel import distributed
from rl_curriculum.sampling import turns
from rl_curriculum.train.setup.errors import fail

__all__ = ["Limits", "Framing", "Played", "observation_framing", "make_framing",
           "least_observation_cap", "check_observation_cap", "observation_ids", "empty_played",
           "replay", "finished_rows", "step_turns", "play", "episode_stats",
           "demonstration_row", "demonstration_rows"]

_MARK = "\u2063OBSERVATION\u2063"  # a placeholder no template writes on its own


class Limits(NamedTuple):
  """An episode's bounds."""
  max_turns: int           # H: turns of the policy at most (the batch's horizon)
  turn_tokens: int         # tokens one turn may draw
  observation_tokens: int  # ids one observation may take, its framing included
  max_new_tokens: int      # N: positions of the whole episode (turns and observations)


class Framing(NamedTuple):
  """The ids around an observation (`make_framing`), tokenised once for a run."""
  before: tuple[int, ...]  # after a turn's end-of-turn id, before the observation's text
  after: tuple[int, ...]   # after the text, up to where the policy's next turn starts
  close: int               # the end-of-turn id, written first after a turn cut before it
  stops: tuple[int, ...]   # ids that end a turn


class Played(NamedTuple):
  """Each row's episode (R rows; a row that was not played has zeros)."""
  rewards: np.ndarray       # f32[R] the return: the sum of its turns' rewards
  turn_rewards: np.ndarray  # f32[R, H] each turn's reward
  correct: np.ndarray       # bool[R] solved
  turns: np.ndarray         # i32[R] turns the policy wrote
  tool_calls: np.ndarray    # i32[R] turns with a tool call
  well_formed: np.ndarray   # i32[R] turns whose call or answer parsed
  malformed: np.ndarray     # i32[R] turns with neither a well-formed call nor an answer
  tool_errors: np.ndarray   # i32[R] turns the environment failed on (`Step.error`)
  obs_cut: np.ndarray       # i32[R] observations cut to the cap
  cut: np.ndarray           # bool[R] ended by a limit (turns or positions), not by its task
  oldest: np.ndarray        # i32[R] the oldest version of the weights that drew a token of the
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


def make_framing(tokenizer, template: str, stop_ids: Sequence[int] = ()) -> Framing:
  """The run's `Framing`: `observation_framing` tokenised once; turns end at the tokenizer's
  EOS (the end-of-turn id) or one of `stop_ids`."""
  before, after = (tuple(tokenizer.encode(part)) for part in
                   observation_framing(tokenizer, template))
  return Framing(before=before, after=after, close=int(tokenizer.eos_id),
                 stops=tuple(sorted({int(tokenizer.eos_id), *(int(i) for i in stop_ids)})))


def least_observation_cap(framing: Framing) -> int:
  """The fewest ids an observation's cap may be: the closing id of a cut turn, the framing, and
  one id of text."""
  return 1 + len(framing.before) + len(framing.after) + 1


def check_observation_cap(cap: int, framing: Framing) -> None:
  """Raises ConfigError (rl.observation_tokens) when `cap` cannot hold a framed observation."""
  least = least_observation_cap(framing)
  if cap < least:
    fail("rl.observation_tokens", f"{cap} ids cannot hold an observation: its chat framing "
         f"takes {least - 2} (and a cut turn's closing id 1 more); use at least {least}, and "
         "room for the replies' text (a longer reply loses its middle)")


def observation_ids(tokenizer, framing: Framing, text: str, cap: int,
                    closed: bool = True) -> tuple[list[int], bool]:
  """(ids, cut): the observation `text` framed as one more message (first the end-of-turn id
  when the turn before it was not `closed`), at most `cap` ids: text read as plain text
  (`encode_text`), and cut from its middle when longer than the room left, head and tail kept.

  Raises:
    ValueError: `cap` below `least_observation_cap` (validated before a run starts).
  """
  head = list(framing.before) if closed else [framing.close, *framing.before]
  room = cap - len(head) - len(framing.after)
  if room < 1:
    raise ValueError(f"an observation cap of {cap} ids leaves no room for text after the "
                     f"framing's {len(head) + len(framing.after)}")
  ids = tokenizer.encode_text(text)
  cut = len(ids) > room
  if cut:
    first = (room + 1) // 2
    ids = ids[:first] + ids[len(ids) - (room - first):]
  return head + ids + list(framing.after), cut


def empty_played(shape, width: int) -> Played:
  """`Played` of no episode: zeros of `shape` (R, or (W, R) for records of W batches), each
  turn's reward of `shape` + (width,)."""
  shape = (shape,) if isinstance(shape, int) else tuple(shape)
  count = lambda: np.zeros(shape, np.int32)
  return Played(rewards=np.zeros(shape, np.float32),
                turn_rewards=np.zeros(shape + (width,), np.float32), correct=np.zeros(shape, bool),
                turns=count(), tool_calls=count(), well_formed=count(), malformed=count(),
                tool_errors=count(), obs_cut=count(), cut=np.zeros(shape, bool), oldest=count())


class _Next(NamedTuple):
  """What a row's episode needs next (`replay`): nothing (decoding, queued, or over), or a
  reply written after its last turn and the row queued again."""
  reply: Optional[list]  # ids to write after the last turn, or None
  start: int            # where they go: one past the last turn's last position


def replay(task, problem, seed: int, row: tuple, done: bool, *, tokenizer, framing: Framing,
           limits: Limits, out: Played, i: int, transcript: Optional[list] = None) -> _Next:
  """Row i's episode so far, read from its buffer: its task reset and stepped again on the text
  of each of its finished turns (runs of drawn positions; the last run is a finished turn only
  when the row is `done`), the statistics written into `out` at i, and what it needs next.
  row = (tokens i32[N], mask f32[N], versions i32[N], forced int: positions before it hold
  written replies). With `transcript` (a list), each finished turn appends
  {"turn", "reward", "reply"} to it (the reply's text as the policy reads it, "" after the last
  turn). Tasks are pure, so the buffer alone is the episode's state:
  nothing of it needs keeping between calls, steps or a restart."""
  tokens, mask, versions, forced = row
  drawn = np.flatnonzero(mask > 0)
  runs = np.split(drawn, np.flatnonzero(np.diff(drawn) > 1) + 1) if drawn.size else []
  out.oldest[i] = versions[drawn].min() if drawn.size else 0
  state = task.reset(problem, int(seed))
  budget = min(limits.max_turns, task.max_turns(problem))
  for k, run in enumerate(runs[:len(runs) if done else len(runs) - 1]):
    end = int(run[-1]) + 1
    text = tokenizer.decode(tokens[int(run[0]):end])
    state, step = task.step(problem, state, text)
    _count(out, i, k, step)
    if step.done:
      _note(transcript, text, step, "")
      return _Next(None, end)
    if out.turns[i] >= budget:  # out of turns: no reply is written
      _note(transcript, text, step, "")
      out.cut[i] = True
      return _Next(None, end)
    closed = int(tokens[end - 1]) in framing.stops
    ids, cut = observation_ids(tokenizer, framing, step.observation, limits.observation_tokens,
                               closed=closed)
    out.obs_cut[i] += cut
    if transcript is not None:  # the reply as the policy reads it: cut, if it was
      head = len(framing.before) + (not closed)
      _note(transcript, text, step, tokenizer.decode(ids[head:len(ids) - len(framing.after)])
            if cut else step.observation)
    if end + len(ids) >= limits.max_new_tokens:
      out.cut[i] = True
      return _Next(None, end)
    if k == len(runs) - 1 and forced <= end:  # its reply is not written yet
      return _Next(ids, end)
  return _Next(None, 0)


def _count(out: Played, i: int, k: int, step) -> None:
  """Turn k of row i's `step` into its statistics."""
  out.turns[i] += 1
  out.rewards[i] += np.float32(step.reward)
  if k < out.turn_rewards.shape[1]:
    out.turn_rewards[i, k] = step.reward
  out.correct[i] |= bool(step.correct)
  out.tool_calls[i] += bool(step.tool_call)
  out.well_formed[i] += bool(step.tool_call and step.well_formed)
  out.malformed[i] += not step.well_formed
  out.tool_errors[i] += bool(getattr(step, "error", False))


def _note(transcript: Optional[list], text: str, step, reply: str) -> None:
  if transcript is not None:
    transcript.append({"turn": text, "reward": float(step.reward), "reply": reply})


def demonstration_row(task, problem, tokenizer, *, eos_id: int, framing: Optional[Framing],
                      cap: int) -> tuple[list[int], list[float]]:
  """(ids, mask) of the episode that solves `problem` (`Task.demonstration`), token in, token out
  as a rollout writes it: each turn's ids and its end-of-turn id `eos_id` with mask 1, each
  reply its task gives (`observation_ids` under `framing`, at most `cap` ids) with mask 0. A
  single-turn task's row is its target and EOS."""
  ids, mask = [], []
  state = task.reset(problem, 0)
  for text in task.demonstration(problem):
    turn = list(tokenizer.encode(text)) + [int(eos_id)]
    ids, mask = ids + turn, mask + [1.0] * len(turn)
    state, step = task.step(problem, state, text)
    if step.done:
      break
    reply, _ = observation_ids(tokenizer, framing, step.observation, cap)
    ids, mask = ids + reply, mask + [0.0] * len(reply)
  return ids, mask


def demonstration_rows(task, problems: Sequence[Any], tokenizer, *, framing: Optional[Framing],
                       cap: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens i32[N, L], mask f32[N, L]): the solving episodes of N problems
  (`demonstration_row`), right-padded with the pad id to the longest: an SFT warm start's
  targets, the replies of an environment's episodes given no loss, as RL gives them none."""
  rows = [demonstration_row(task, p, tokenizer, eos_id=tokenizer.eos_id, framing=framing,
                            cap=cap) for p in problems]
  length = max(len(ids) for ids, _ in rows)
  tokens = np.full((len(rows), length), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(rows), length), np.float32)
  for i, (ids, weights) in enumerate(rows):
    tokens[i, :len(ids)], mask[i, :len(ids)] = ids, weights
  return tokens, mask


def _check_finite(played: Played, problems: Sequence[Optional[Any]]) -> None:
  """Raises ValueError naming the first problem whose return is not finite (a verifier bug: one
  NaN would reach every statistic that averages rewards)."""
  bad = np.flatnonzero(~np.isfinite(played.rewards))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"task {problems[i].task!r} scored {played.rewards[i]} (not finite) for "
                     f"prompt {problems[i].prompt!r} ({bad.size} of {played.rewards.size} "
                     "returns of this batch are not finite); rewards must be finite numbers")


def finished_rows(tokens, mask, versions=None) -> turns.Rows:
  """`turns.Rows` of rows sampled whole (tokens i32[R, N], mask f32[R, N]; versions i32[R, N],
  None: 0), every one stopped and none given a reply: what `step_turns` reads of a one-turn
  batch that no engine state holds (`rows_of=lambda rows, _: rows`)."""
  r = tokens.shape[0]
  return turns.Rows(tokens=tokens, mask=mask,
                    versions=jnp.zeros(tokens.shape, jnp.int32) if versions is None else versions,
                    done=jnp.ones((r,), bool), forced=jnp.zeros((r,), jnp.int32))


def _host_rows(rows, mine: Optional[np.ndarray]) -> Any:
  """The engine's rows of one generation (`turns.Rows`) as NumPy: all of them, or this process's
  rows `mine` (ascending) of a batch laid over several processes."""
  if mine is None:
    return jax.tree.map(lambda x: np.asarray(distributed.to_host(x)), rows)
  return jax.tree.map(distributed.local_rows, rows)


def step_turns(state, generation: int, *, problems: Sequence[Optional[Any]], task,
               seeds: Sequence[int], tokenizer, framing: Framing, limits: Limits,
               width: Optional[int] = None, mine: Optional[np.ndarray] = None, mesh=None,
               read_only: bool = False, rows_of: Callable = turns.rows_of
               ) -> tuple[Any, Played, bool]:
  """(state, `Played` of the generation's rows so far, whether a row was queued again): every
  row of generation `generation` (batch order; problems[r] its problem, None: not played)
  whose turn has ended and whose episode goes on gets its task's reply and is queued again
  (`turns.requeue`; not with `read_only`); the statistics of a row are final once it is done
  and not queued. `width` is the turns `Played.turn_rewards` holds (default limits.max_turns);
  `mine` the rows this process replays (None: all; the others' statistics are gathered);
  `rows_of(state, generation)` reads the engine's rows (`turns.Rows`).

  Raises:
    ValueError: a return that is not finite.
  """
  r = len(problems)
  mine_or_all = np.arange(r) if mine is None else np.asarray(mine)
  rows = _host_rows(rows_of(state, jnp.int32(generation)), mine)
  out = empty_played(len(mine_or_all), width or limits.max_turns)
  o = limits.observation_tokens
  again, lengths, start, limit = (np.zeros(len(mine_or_all), t) for t in (bool, *[np.int32] * 3))
  observations = np.zeros((len(mine_or_all), o), np.int32)
  for j, i in enumerate(mine_or_all):
    if problems[i] is None:
      continue
    row = (rows.tokens[j], rows.mask[j], rows.versions[j], int(rows.forced[j]))
    wants = replay(task, problems[i], seeds[i], row, bool(rows.done[j]), tokenizer=tokenizer,
                   framing=framing, limits=limits, out=out, i=j)
    if wants.reply is not None:
      again[j], lengths[j], start[j] = True, len(wants.reply), wants.start
      observations[j, :len(wants.reply)] = wants.reply
      limit[j] = min(wants.start + len(wants.reply) + limits.turn_tokens, limits.max_new_tokens)
  if mine is not None:
    gather = lambda x: distributed.gather_rows(x, mine_or_all, r)
    out = Played(*(gather(x) for x in out))
    again, observations, lengths, start, limit = (gather(x) for x in
                                                  (again, observations, lengths, start, limit))
  _check_finite(out, problems)
  if again.any() and not read_only:
    state = turns.requeue(state, *(jnp.asarray(x) for x in (again, observations, lengths, start,
                                                            limit)),
                          generation=jnp.int32(generation), mesh=mesh)
  return state, out, bool(again.any())


def play(state, *, run: Callable[[Any], Any], problems: Sequence[Optional[Any]], task,
         seeds: Sequence[int], tokenizer, framing: Framing, limits: Limits,
         mesh=None, generation: int = 0, rows_of: Callable = turns.rows_of
         ) -> tuple[Any, Played]:
  """(the engine state after every row's episode, `Played`): the rows of generation
  `generation` queued in `state` (`inflight.admit`, each allowed `limits.turn_tokens` tokens)
  play their episodes: `run(state)` decodes a round of turns, the tasks step on the host
  (`step_turns`), and the rows that go on are queued again, until none is. problems[r] is row
  r's problem (None: not played), seeds[r] its episode's seed."""
  while True:
    state = run(state)
    state, played, again = step_turns(state, generation, problems=problems, task=task,
                                      seeds=seeds, tokenizer=tokenizer, framing=framing,
                                      limits=limits, mesh=mesh, rows_of=rows_of)
    if not again:
      return state, played


def episode_stats(played: Played, valid: np.ndarray) -> dict:
  """The episodes' statistics for the log over the played rows `valid` (bool[R]): turns, the
  share of turns with a tool call, the share of calls that parsed, the share of turns with
  neither a call nor an answer, of turns the environment failed on, of observations cut to the
  cap, the share of episodes solved and cut by a limit, and the share of solved episodes that
  called a tool."""
  v = np.asarray(valid, bool).reshape(-1)
  turns_ = max(int(played.turns[v].sum()), 1)
  calls = int(played.tool_calls[v].sum())
  episodes = max(int(v.sum()), 1)
  solved = v & played.correct
  return {"episode/turns": float(played.turns[v].sum()) / episodes,
          "episode/tool_call_rate": calls / turns_,
          "episode/well_formed_calls": float(played.well_formed[v].sum()) / max(calls, 1),
          "episode/malformed_turns": float(played.malformed[v].sum()) / turns_,
          "episode/tool_errors": float(played.tool_errors[v].sum()) / turns_,
          "episode/obs_cut": float(played.obs_cut[v].sum()) / turns_,
          "episode/success": float(played.correct[v].sum()) / episodes,
          "episode/cut": float(played.cut[v].sum()) / episodes,
          "episode/solved_with_tool": float((played.tool_calls[solved] > 0).sum())
                                      / max(int(solved.sum()), 1)}
