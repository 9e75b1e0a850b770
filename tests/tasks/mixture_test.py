"""Several tasks as one (`MixtureTask`): bins are (task, bin) pairs, each problem is its own
task's, scored by its own verifier."""

import dataclasses

from hypothesis import given, settings, strategies as st
import pytest

from rl_curriculum.tasks import MixtureTask, get_task
from rl_curriculum.tasks.base import Score

NAME = "countdown+zebra+arithmetic"


def test_bins_are_the_tasks_bins_in_order():
  mix = get_task(NAME)
  parts = [get_task(n) for n in ("countdown", "zebra", "arithmetic")]
  assert mix.bin_names == tuple(f"{p.name}/{b}" for p in parts for b in p.bin_names)
  assert mix.task_names == ("countdown", "zebra", "arithmetic")
  offset = len(parts[0].bin_names) + len(parts[1].bin_names)
  # arithmetic's evaluation-only bins stay evaluation-only, shifted by the bins before them.
  assert mix.eval_only_bins == tuple(offset + b for b in parts[2].eval_only_bins)
  assert mix.bin_of("zebra", "2x3") == len(parts[0].bin_names) + 1
  assert mix.task_of(mix.bin_of("zebra", "2x3")) == "zebra"
  assert [mix.task_of(b) for b in range(3)] == ["countdown"] * 3
  with pytest.raises(ValueError, match="not a bin"):
    mix.bin_of("zebra", "n3")


def test_problems_are_the_parts_problems_with_the_mixture_bin():
  mix = get_task(NAME, template="chat")
  for b in range(mix.num_difficulties):
    task, local = mix.task_of(b), mix.bin_names[b].split("/", 1)[1]
    part = get_task(task, template="chat")
    own = part.generate(7, part.bin_names.index(local))
    problem = mix.generate(7, b)
    assert problem == dataclasses.replace(own, difficulty=b)
    assert mix.prompt_messages(problem) == part.prompt_messages(own)


def test_each_problem_is_scored_by_its_own_task():
  mix = get_task(NAME)
  for b in range(mix.num_difficulties):
    problem = mix.generate(3, b)
    assert mix.score(problem, problem.target) == Score(1.0, True, True)
  # A zebra answer to a countdown problem is wrong, and the other way round.
  countdown, zebra = mix.generate(0, 0), mix.generate(0, mix.bin_of("zebra", "2x2"))
  assert not mix.score(countdown, zebra.target).correct
  assert not mix.score(zebra, countdown.target).correct
  # The batch scorer routes row by row.
  rewards, correct, _ = mix.score_batch([countdown, zebra], [countdown.target, "nonsense"])
  assert correct.tolist() == [True, False] and rewards[0] == 1.0


def test_a_problem_from_outside_the_mixture_scores_zero():
  mix = get_task("countdown+zebra")
  stray = get_task("arithmetic").generate(0, 0)
  assert mix.score(stray, stray.target) == Score(0.0, False, False)
  mislabelled = dataclasses.replace(mix.generate(0, 0), difficulty=99)
  assert mix.score(mislabelled, "1") == Score(0.0, False, False)


def test_bad_mixtures_are_refused():
  with pytest.raises(ValueError, match="each task once"):
    get_task("zebra+zebra")
  with pytest.raises(KeyError, match="unknown task"):
    get_task("zebra+chess")
  with pytest.raises(ValueError, match="at least two"):
    MixtureTask([get_task("zebra")])
  with pytest.raises(ValueError, match="one template"):
    MixtureTask([get_task("zebra"), get_task("countdown", template="chat")])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 24), st.text(max_size=200))
def test_any_text_scores_without_raising(b, text):
  mix = get_task("countdown+zebra+arc1d")
  problem = mix.generate(1, b)
  score = mix.score(problem, text)
  assert score.reward in (0.0, mix.format_bonus, 1.0)
  assert score.correct == (score.reward == 1.0)


def test_task_options_reach_the_named_task_only():
  mix = get_task("countdown+arc1d", task_options={"arc1d": {"num_shots": 1}})
  assert mix.parts["arc1d"].num_shots == 1
  assert get_task("arc1d", task_options={"arc1d": {"num_shots": 2}}).num_shots == 2
  problem = mix.generate(5, mix.bin_of("arc1d", "move_10"))
  assert problem.prompt.count("Input:") == 2  # one worked row, then the query
  with pytest.raises(KeyError, match="does not"):
    get_task("countdown+arc1d", task_options={"zebra": {}})
  with pytest.raises(TypeError):
    get_task("countdown+arc1d", task_options={"countdown": {"num_shots": 1}})
