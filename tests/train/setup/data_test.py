"""Tests of rl_curriculum/train/setup/data.py: held-out prompts are never trained on, whatever the bin.

The arithmetic task with the scratch config's bins (train 0-5, evaluate 0-11), smaller counts
per bin. Bin spaces used below, enumerated by hand: add_1d_1d (bin 0) 100 prompts, add_2d_2d
(bin 2) 8100, mul_1d_1d (bin 4) 64.
"""

import os
import subprocess
import sys

import pytest

from rl_curriculum import tasks
from rl_curriculum.tasks import base
from rl_curriculum.train.setup import data

TRAIN_BINS = (0, 1, 2, 3, 4, 5)
EVAL_BINS = tuple(range(12))
COUNTS = dict(train_per_bin=300, sft_per_bin=200, eval_per_bin=32)
FRACTION = 0.2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ADD_1D_1D = [f"{a}+{b}=" for a in range(10) for b in range(10)]
ADD_2D_2D = [f"{a}+{b}=" for a in range(10, 100) for b in range(10, 100)]
MUL_1D_1D = [f"{a}*{b}=" for a in range(2, 10) for b in range(2, 10)]


@pytest.fixture(scope="module")
def task():
  return tasks.get_task("arithmetic")


@pytest.fixture(scope="module")
def splits(task):
  return data.make_splits(task, TRAIN_BINS, EVAL_BINS, held_out_fraction=FRACTION, **COUNTS)


def _prompts(problems, b=None):
  return {p.prompt for p in problems if b is None or p.difficulty == b}


def test_seed_disjoint_splits_still_share_prompts(task):
  # Splits apart by seed only (`problems` without `exclude`, the scheme runs used before the
  # held-out partition): mul_1d_1d has 64 problems, so its RL pool holds every one of them and
  # the whole "held-out" set is training data.
  rl = _prompts(data.problems(task, [4], 200, "rl"))
  evaluation = _prompts(data.problems(task, [4], 32, "eval"))
  assert rl == set(MUL_1D_1D)
  assert evaluation and evaluation <= rl


def test_held_out_prompts_are_never_trained_on(splits):
  train = _prompts(splits.rl) | _prompts(splits.sft)
  for b in EVAL_BINS:
    held = _prompts(splits.held_out[b])
    assert held, b
    assert not held & train, (b, sorted(held & train)[:5])
  assert not any(data.held_out(p, FRACTION) for p in train)
  for b in TRAIN_BINS:  # trained bins: held-out sets only from the held-out part
    assert all(data.held_out(p.prompt, FRACTION) for p in splits.held_out[b])


def test_problems_sit_in_their_bins_with_distinct_prompts(splits):
  for name, problems, per_bin in (("rl", splits.rl, COUNTS["train_per_bin"]),
                                  ("sft", splits.sft, COUNTS["sft_per_bin"])):
    assert {p.difficulty for p in problems} == set(TRAIN_BINS), name
    for b in TRAIN_BINS:
      in_bin = [p.prompt for p in problems if p.difficulty == b]
      assert len(in_bin) == len(set(in_bin)) <= per_bin, (name, b)
    for b in (2, 3):  # thousands of prompts: the full count
      assert sum(p.difficulty == b for p in problems) == per_bin, (name, b)
  for b, problems in splits.held_out.items():
    assert {p.difficulty for p in problems} == {b}
    assert len(_prompts(problems)) == len(problems) == splits.sizes[b].count


def test_partition_is_stable_and_nested():
  # Fixed sides (CRC-32 of "7*8=" is 0.213 * 2**32, of "3+5=" 0.053, of "12+7=" 0.985).
  assert data.held_out("3+5=", 0.2) and data.held_out("3+5=", 0.25)
  assert not data.held_out("7*8=", 0.2) and data.held_out("7*8=", 0.25)
  assert not data.held_out("12+7=", 0.25)
  sides = [data.held_out(p, 0.2) for p in ADD_2D_2D]
  assert sides == [data.held_out(p, 0.2) for p in ADD_2D_2D]
  # Nested: held out at 0.2 means held out at 0.25.
  assert all(data.held_out(p, 0.25) for p, s in zip(ADD_2D_2D, sides) if s)
  # Another process with another hash salt sees the same sides.
  code = ("from rl_curriculum.train.setup import data; "
          f"print(sum(data.held_out(p, 0.2) for p in {ADD_2D_2D[:2000]!r}))")
  env = dict(os.environ, PYTHONHASHSEED="12345")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, check=True).stdout
  assert int(out) == sum(sides[:2000])


@pytest.mark.parametrize("fraction", [0.2, 0.25])
def test_held_out_share_of_a_large_space_is_the_fraction(fraction):
  share = sum(data.held_out(p, fraction) for p in ADD_2D_2D) / len(ADD_2D_2D)
  assert abs(share - fraction) < 0.015, share


@pytest.mark.parametrize("b,space", [(0, ADD_1D_1D), (4, MUL_1D_1D)])
def test_small_trained_bins_report_fewer_held_out_problems(splits, b, space):
  held = {p for p in space if data.held_out(p, FRACTION)}
  size = splits.sizes[b]
  assert size.trained and size.requested == COUNTS["eval_per_bin"]
  # Every held-out prompt of the space, and every other one for training: nothing lost.
  assert _prompts(splits.held_out[b]) == held
  assert size.count == len(held) < size.requested
  assert abs(size.count - FRACTION * len(space)) <= 0.1 * len(space)
  assert _prompts(splits.rl, b) == set(space) - held


def test_bins_not_trained_on_get_their_full_held_out_sets(task, splits):
  for b in EVAL_BINS:
    if b not in TRAIN_BINS:
      assert splits.sizes[b] == data.HeldOutSize(COUNTS["eval_per_bin"], COUNTS["eval_per_bin"],
                                                 False)
  # Drawn freely: some of them lie on the training side of the partition.
  free = _prompts(splits.held_out[9])
  assert any(not data.held_out(p, FRACTION) for p in free)
  assert "mul_1d_1d* 15/32" in splits.describe(task.bin_names)


def test_output_is_deterministic(task, splits):
  again = data.make_splits(task, TRAIN_BINS, EVAL_BINS, held_out_fraction=FRACTION, **COUNTS)
  assert again == splits


def test_problems_keeps_the_seed_scheme(task):
  for split in ("rl", "sft", "eval"):
    ours = data.problems(task, [1, 6], 50, split)
    assert [p.seed for p in ours[:3]] == [data.SEED_BASE[split] + data.BIN_STRIDE + i
                                          for i in range(3)]
    assert len({p.prompt for p in ours}) == len(ours) == 100
  kept = data.problems(task, [0], 100, "rl", exclude=lambda p: p.startswith("3+"))
  assert _prompts(kept) == {p for p in ADD_1D_1D if not p.startswith("3+")}


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_bad_fraction_raises(task, fraction):
  with pytest.raises(ValueError, match="held_out_fraction"):
    data.make_splits(task, TRAIN_BINS, EVAL_BINS, held_out_fraction=fraction, **COUNTS)


def test_bad_arguments_raise(task):
  with pytest.raises(ValueError, match="unknown split"):
    data.problems(task, [0], 10, "train")
  with pytest.raises(ValueError, match="evaluation-only"):
    data.make_splits(task, (0, 8), EVAL_BINS, held_out_fraction=FRACTION, **COUNTS)
  with pytest.raises(ValueError, match="repeats"):
    data.make_splits(task, (0, 0), EVAL_BINS, held_out_fraction=FRACTION, **COUNTS)
  with pytest.raises(ValueError, match="train_per_bin"):
    data.make_splits(task, TRAIN_BINS, EVAL_BINS, held_out_fraction=FRACTION,
                     train_per_bin=0, sft_per_bin=0, eval_per_bin=8)


class _OnePrompt(base.Task):
  """One bin holding a single prompt: it is either held out or trained on, never both."""
  name = "one_prompt"
  bin_names = ("only",)

  def _make(self, seed, difficulty):
    return base.Problem(task=self.name, difficulty=difficulty, prompt="7*8=", question="7*8?",
                        answer="56", target="56", seed=seed)

  def _check(self, problem, answer):
    return answer == problem.answer, True


def test_a_bin_left_empty_raises():
  kwargs = dict(train_per_bin=4, sft_per_bin=4, eval_per_bin=4)
  with pytest.raises(ValueError, match="no RL problem"):  # "7*8=" is held out at 0.25
    data.make_splits(_OnePrompt(), (0,), (0,), held_out_fraction=0.25, **kwargs)
  with pytest.raises(ValueError, match="no held-out prompt"):  # and trained on at 0.2
    data.make_splits(_OnePrompt(), (0,), (0,), held_out_fraction=0.2, **kwargs)
  # Not trained on: the bin's only prompt is free to be held out.
  splits = data.make_splits(_OnePrompt(), (), (0,), held_out_fraction=0.2, **kwargs)
  assert splits.sizes[0] == data.HeldOutSize(1, 4, False) and not splits.rl


# ----------------------------------------------------------------------------- pools, tokenizer

SMALL = dict(train_per_bin=20, sft_per_bin=10, eval_per_bin=6)


def test_pools_hold_every_split_padded_to_the_longest_prompt(task, tmp_path):
  train_bins = (2, 0)  # arm 0 = bin 2: arms follow train_bins, not the bin numbers
  splits = data.make_splits(task, train_bins, (0, 2, 7), held_out_fraction=FRACTION, **SMALL)
  corpus = data.tokenizer_corpus(splits)
  assert corpus[:len(splits.rl)] == [p.prompt + p.target for p in splits.rl]
  assert corpus[len(splits.rl) + len(splits.sft):] == [
      p.prompt for ps in splits.held_out.values() for p in ps]
  tok = data.workdir_tokenizer(str(tmp_path), corpus, vocab_size=64)
  pools = data.make_pools(splits, task, tok, train_bins)

  every = splits.rl + splits.sft + [p for ps in splits.held_out.values() for p in ps]
  assert pools.prompt_len == max(len(tok.encode(p.prompt)) for p in every)
  assert [p.prompt for p in pools.rl.problems] == [p.prompt for p in splits.rl]
  assert [int(a) for a in pools.rl.arms] == [train_bins.index(p.difficulty) for p in splits.rl]
  assert list(pools.eval_sets) == [task.bin_names[b] for b in (0, 2, 7)]
  for pool in [pools.rl, pools.sft, *pools.eval_sets.values()]:
    assert pool.tokens.shape[1] == pools.prompt_len
    row = pool.tokens[0][pool.mask[0].astype(bool)]  # left-padded: the real tokens, in order
    assert list(row) == tok.encode(pool.problems[0].prompt)
  targets, mask = pools.sft_targets
  assert targets.shape[0] == len(splits.sft)
  first = targets[0][mask[0] > 0]
  assert list(first) == tok.encode(splits.sft[0].target) + [tok.eos_id]


def test_workdir_tokenizer_is_trained_once_then_loaded(task, tmp_path):
  splits = data.make_splits(task, (0, 1), (0,), held_out_fraction=FRACTION, **SMALL)
  first = data.workdir_tokenizer(str(tmp_path), data.tokenizer_corpus(splits), vocab_size=64)
  stamp = os.path.getmtime(tmp_path / "tokenizer.model")
  # A different corpus is ignored: the workdir's file is the run's tokenizer.
  again = data.workdir_tokenizer(str(tmp_path), ["zzz qqq"] * 50, vocab_size=64)
  assert os.path.getmtime(tmp_path / "tokenizer.model") == stamp
  text = splits.rl[0].prompt + splits.rl[0].target
  assert again.encode(text) == first.encode(text)


def test_pools_without_sft_problems_have_no_sft_pool(task, tmp_path):
  splits = data.make_splits(task, (0,), (0,), held_out_fraction=FRACTION,
                            **{**SMALL, "sft_per_bin": 0})
  tok = data.workdir_tokenizer(str(tmp_path), data.tokenizer_corpus(splits), vocab_size=64)
  pools = data.make_pools(splits, task, tok, (0,))
  assert pools.sft is None and pools.sft_targets is None


# ----------------------------------------------------------------------------- task mixtures

MIXTURE = "countdown+zebra+arc1d"


def test_arms_are_bins_or_the_tasks_of_a_mixture():
  mix = tasks.get_task(MIXTURE)
  bins = (mix.bin_of("zebra", "2x2"), mix.bin_of("countdown", "n3"), mix.bin_of("zebra", "3x3"),
          mix.bin_of("countdown", "n5"))
  by_bin = data.arms_of(mix, bins)
  assert by_bin == data.Arms(of_bin=(0, 1, 2, 3),
                             names=("zebra/2x2", "countdown/n3", "zebra/3x3", "countdown/n5"))
  # One arm per task with a training bin, numbered by its first bin; arc1d has none.
  assert data.arms_of(mix, bins, "task") == data.Arms(of_bin=(0, 1, 0, 1),
                                                      names=("zebra", "countdown"))
  with pytest.raises(ValueError, match="mixture of tasks"):
    data.arms_of(tasks.get_task("arithmetic"), (0, 1), "task")
  with pytest.raises(ValueError, match="unknown arm layout"):
    data.arms_of(mix, bins, "pair")


def test_mixture_weights_give_each_task_its_share_of_the_pool():
  mix = tasks.get_task(MIXTURE)
  bins = [mix.bin_of("countdown", n) for n in ("n3", "n4", "n5")] + [
      mix.bin_of("zebra", "2x2"), mix.bin_of("arc1d", "move_10"), mix.bin_of("arc1d", "fill_10")]
  assert data.pool_sizes(mix, bins, 100) == {b: 100 for b in bins}
  sizes = data.pool_sizes(mix, bins, 100, (2.0, 1.0, 1.0))
  # 600 problems: countdown 300 (100 per bin), zebra 150, arc1d 150 (75 per bin).
  assert [sizes[b] for b in bins] == [100, 100, 100, 150, 75, 75]
  # A task without a training bin (zebra) takes no share: of 400, countdown 1/4, arc1d 3/4.
  kept = bins[:2] + bins[4:]
  sizes = data.pool_sizes(mix, kept, 100, (1.0, 5.0, 3.0))
  assert [sizes[b] for b in kept] == [50, 50, 150, 150]
  with pytest.raises(ValueError, match="one weight > 0 per task"):
    data.pool_sizes(mix, bins, 100, (1.0, 1.0))
  with pytest.raises(ValueError, match="single task"):
    data.pool_sizes(tasks.get_task("arithmetic"), (0,), 100, (1.0,))


def test_splits_take_a_size_per_bin_and_pools_take_arms_per_bin(tmp_path):
  mix = tasks.get_task("countdown+arithmetic")
  bins = (mix.bin_of("countdown", "n3"), mix.bin_of("arithmetic", "add_2d_2d"),
          mix.bin_of("arithmetic", "sub_2d_2d"))
  splits = data.make_splits(mix, bins, bins, train_per_bin={bins[0]: 12, bins[1]: 5, bins[2]: 3},
                            sft_per_bin=4, eval_per_bin=4, held_out_fraction=FRACTION)
  assert [sum(p.difficulty == b for p in splits.rl) for b in bins] == [12, 5, 3]
  assert [sum(p.difficulty == b for p in splits.sft) for b in bins] == [4, 4, 4]
  with pytest.raises(ValueError, match="names bins"):
    data.make_splits(mix, bins, bins, train_per_bin={bins[0]: 12}, sft_per_bin=0,
                     eval_per_bin=4, held_out_fraction=FRACTION)
  tok = data.workdir_tokenizer(str(tmp_path), data.tokenizer_corpus(splits), vocab_size=96)
  arms = data.arms_of(mix, bins, "task")
  pools = data.make_pools(splits, mix, tok, bins, bin_arms=arms.of_bin)
  assert pools.rl.num_arms == 2
  assert [int(a) for a in pools.rl.arms] == [0] * 12 + [1] * 8
  # Difficulty is the bin within the problem's own task, not the mixture's bin number.
  arithmetic = tasks.get_task("arithmetic")
  expected = [0.0] * 12 + [float(arithmetic.bin_names.index(n))
                           for n in ["add_2d_2d"] * 5 + ["sub_2d_2d"] * 3]
  assert [float(d) for d in pools.rl.difficulty] == expected


def test_the_quickstart_reports_only_bins_with_its_full_held_out_count():
  # The main job's table claims 200 unseen problems in every bin it reports.
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  c = quickstart.get_config()
  task = tasks.get_task(c.task.name, template=c.task.template)
  got = data.make_splits(task, c.task.train_bins, c.task.eval_bins,
                         train_per_bin=c.task.train_per_bin, sft_per_bin=c.task.sft_per_bin,
                         eval_per_bin=c.task.eval_per_bin,
                         held_out_fraction=c.task.held_out_fraction)
  assert c.task.eval_per_bin >= 200
  assert {b: s.count for b, s in got.sizes.items()} == {b: c.task.eval_per_bin
                                                         for b in c.task.eval_bins}


@pytest.fixture(scope="module")
def parts(task):
  """The validation and test sets of the scratch bins, more per bin than `splits` holds."""
  return {part: data.held_out_sets(task, TRAIN_BINS, EVAL_BINS, 64, FRACTION, part=part)[0]
          for part in ("validation", "test")}


def test_validation_and_test_sets_are_disjoint_from_training_and_each_other(task, splits,
                                                                            parts):
  train = _prompts(splits.rl) | _prompts(splits.sft)
  for b in EVAL_BINS:
    val, test = _prompts(parts["validation"][b]), _prompts(parts["test"][b])
    assert val and test, b
    assert not val & test, (b, sorted(val & test)[:5])
    assert not (val | test) & train, b
    assert all(data.held_out_part(p) == "validation" for p in val)
    assert all(data.held_out_part(p) == "test" for p in test)
    if b in TRAIN_BINS:
      assert all(data.held_out(p, FRACTION) for p in val | test)
  # add_1d_1d (bin 0): 100 prompts, 22 held out, which the two halves share out between them.
  held = {p for p in ADD_1D_1D if data.held_out(p, FRACTION)}
  assert (_prompts(parts["validation"][0]) | _prompts(parts["test"][0])) == held


def test_the_halves_split_a_large_space_evenly_and_do_not_depend_on_the_fraction():
  prompts = [f"{a}+{b}=" for a in range(100, 400) for b in range(100, 130)]  # 9,000 prompts
  share = sum(data.held_out_part(p) == "test" for p in prompts) / len(prompts)
  assert abs(share - 0.5) < 0.02, share
  # Among the held-out prompts too, all of one length here: the halves' hash is not the
  # partition's (a CRC-32 of the prompt behind a prefix would give them all one half).
  held = [p for p in prompts if data.held_out(p, FRACTION)]
  share = sum(data.held_out_part(p) == "test" for p in held) / len(held)
  assert abs(share - 0.5) < 0.05, share
  # A prompt's half is a property of the prompt alone, and the halves of different fractions nest.
  narrow = {p for p in prompts if data.held_out(p, 0.1) and data.held_out_part(p) == "test"}
  wide = {p for p in prompts if data.held_out(p, 0.3) and data.held_out_part(p) == "test"}
  assert narrow and narrow < wide


def test_splits_with_a_part_hold_that_half_and_all_keeps_the_old_sets(task, splits, parts):
  val = data.make_splits(task, TRAIN_BINS, EVAL_BINS, held_out_fraction=FRACTION,
                         held_out_split="validation", **COUNTS)
  assert val.rl == splits.rl and val.sft == splits.sft
  for b in EVAL_BINS:
    assert val.held_out[b] == parts["validation"][b][:COUNTS["eval_per_bin"]]
  sets, sizes = data.held_out_sets(task, TRAIN_BINS, EVAL_BINS, COUNTS["eval_per_bin"],
                                   FRACTION, part="all")
  assert sets == splits.held_out and sizes == splits.sizes
  with pytest.raises(ValueError, match="unknown held-out part"):
    data.held_out_sets(task, TRAIN_BINS, EVAL_BINS, 8, FRACTION, part="train")


def test_environments_hold_out_problems_disjoint_by_construction():
  """Prompts of the calculator and the guessing game carry an id that changes nothing: split by
  prompt, a held-out game would hide a number training games hide. Split by `Task.split_key`, no
  held-out product of a trained level shares its expression with a training one, and no held-out
  game of a trained range hides a number a training game hides (the third levels, never
  trained, are disjoint by their ranges)."""
  task = tasks.get_task("calculator+guess", template="chat")
  splits = data.make_splits(task, (0, 1, 3, 4), (0, 1, 2, 3, 4, 5), train_per_bin=200,
                            sft_per_bin=64, eval_per_bin=32, held_out_fraction=0.2)
  trained = splits.rl + splits.sft
  expressions = {p.meta["expression"] for p in trained if p.task == "calculator"}
  hidden = {p.meta["hidden"] for p in trained if p.task == "guess"}
  held = [p for b in (0, 1, 3, 4) for p in splits.held_out[b]]
  assert {p.task for p in held} == {"calculator", "guess"}
  assert all(p.meta["expression"] not in expressions for p in held if p.task == "calculator")
  assert all(p.meta["hidden"] not in hidden for p in held if p.task == "guess")
  assert {p.meta["hidden"] for p in splits.held_out[3]} == {2, 6}  # of 1 .. 8
  assert all(len(splits.held_out[b]) == 32 for b in (0, 1, 2, 4, 5))
