"""The planner's search over layouts, decode slots, remat policies and microbatches
(rl_curriculum/plan/search.py): its candidates, its order and pruning on a planner whose memory
is a known function of the settings, and one real search compiled for a v5e-4."""

import pytest

from rl_curriculum.plan import search
import test_util

HBM = 10.0


def _small(**fields):
  return test_util.small_plan_config(**{"rl__engine": "continuous", "rl__decode_slots": 8,
                                        **fields})


def test_candidates_are_the_settings_validation_accepts():
  c = _small(rl__prompts_per_step=32, rl__minibatches=2, rl__group_size=8)
  assert search.microbatch_choices(c) == [1, 2, 4, 8, 16, 32, 64, 128]
  assert search.slot_choices(c, 256, 8) == [256, 128, 64, 32, 16, 8]
  assert search.slot_choices(c, 24, 4) == [24, 12]
  assert search.layout_choices(c, 8, 2) == [("learner", 1), ("replicated", 1), ("tensor", 2)]
  assert search.layout_choices(c, 8, 4)[-2:] == [("tensor", 2), ("tensor", 4)]
  c.rl.page_size, c.rl.kv_pages, c.rl.decode_slots = 16, 64, 32
  assert search._kv_pages(c, 64, 8) == 128         # two pages a slot, as configured
  assert search._kv_pages(c, 8, 8) == 8 * (3 + 1 - 1)   # at least a whole row a shard


class _FakePlanner:
  """Plans whose peak memory and bound are known functions of the settings: the learn step's
  memory falls as microbatches rise and with recomputation (none 8, dots 4, block 2 GiB at one
  microbatch, halved per doubling), its time rises with recomputation; the rollout's memory
  rises with decode slots, its time falls with them, the tensor layout fastest."""

  def __init__(self):
    self.calls = []

  def __call__(self, config, *, target, prompt_len, programs):
    del target, prompt_len
    self.calls.append((programs, config.model.remat, config.rl.microbatches,
                       config.parallel.rollout_layout, config.rl.decode_slots))
    rows = {}
    if "learn" in programs:
      memory = {"none": 8.0, "dots": 4.0, "block": 2.0}[config.model.remat] * 64
      rows["learn"] = {"peak_gib": memory / config.rl.microbatches,
                       "bound_s": {"none": 3.0, "dots": 3.5, "block": 4.0}[config.model.remat]
                       + 0.01 * config.rl.microbatches}
    if "sampler" in programs:
      layout, slots = config.parallel.rollout_layout, config.rl.decode_slots
      rows["prefill"] = {"peak_gib": 1.0, "bound_s": 0.1}
      rows["decode"] = {"peak_gib": slots / 16, "bound_s": 64 / slots
                        + {"learner": 3.0, "replicated": 1.0, "tensor": 0.5}[layout]}
    if "select" in programs:
      rows["select"] = {"peak_gib": 0.1, "bound_s": 0.0}
    for row in rows.values():
      row.update(flops=1.0, bytes=1.0, trips=1.0)
    return {"programs": rows, "hbm_gib": HBM, "chip": None, "devices": 4,
            "model": {"matmul_params": 1000, "layers": 1, "attention_width": 8},
            "workload": {"rows": 32, "new_tokens": 8, "trained_prompts": 8, "group": 4,
                         "prompt_len": 8, "epochs": 1}}


def test_search_takes_the_fewest_microbatches_and_the_most_slots_that_fit(monkeypatch):
  """Learn: remat none fits from 64 microbatches (8 x 64 / 64 <= 10 GiB), found by bisection
  over [1 .. 128]; dots is then tried only below 64 and fits from 32, block below 32 and fits
  from 16: the fastest bound is none's (3.64 s), despite more microbatches. Rollout: every
  layout's most slots that fit is 128 (128 / 16 = 8 GiB), the tensor layout's bound the least.
  No candidate is planned twice."""
  fake = _FakePlanner()
  monkeypatch.setattr(search.planner, "plan", fake)
  c = _small(rl__prompts_per_step=256, rl__minibatches=8, rl__group_size=4)
  result = search.search(c, target="v5e-4")
  learn, rollout = result["learn"], result["rollout"]
  assert learn["overrides"] == {"model.remat": "none", "rl.microbatches": 64}
  assert learn["bound_s"] == pytest.approx(3.64)
  tried = {(r, m) for p, r, m, _, _ in fake.calls if p == ("learn",)}
  assert ("dots", 32) in tried and ("block", 16) in tried
  assert not any(r == "dots" and m >= 64 for r, m in tried)
  assert not any(r == "block" and m >= 32 for r, m in tried)
  assert len(tried) == len([c for c in fake.calls if c[0] == ("learn",)])
  assert len(tried) < 3 * len(search.microbatch_choices(c))
  assert rollout["overrides"]["parallel.rollout_layout"] == "tensor"
  assert rollout["overrides"]["rl.decode_slots"] == 128
  assert rollout["bound_s"] == pytest.approx(0.1 + 0.5 + 0.5)
  assert "--config.rl.microbatches=64" in result["overrides"]
  assert "--config.parallel.rollout_layout=tensor" in result["overrides"]
  assert result["unfit"] == {}
  assert result["step"]["step_s"] == pytest.approx(0.0 + 1.1 + 3.64)
  assert search.describe(result).splitlines()[-1] == "run it with: " + " ".join(
      result["overrides"])


def test_a_family_that_fits_nowhere_is_named_with_the_least_it_needed(monkeypatch):
  fake = _FakePlanner()
  monkeypatch.setattr(search.planner, "plan", fake)
  c = _small(rl__prompts_per_step=4, rl__minibatches=1, rl__group_size=2)  # at most 8 micro
  result = search.search(c, target="v5e-4")
  assert result["learn"] is None and result["step"] is None
  assert result["unfit"]["learn"] == pytest.approx(2.0 * 64 / 8)
  assert "DOES NOT FIT: no learn candidate fits" in search.describe(result)


def test_search_needs_a_tpu_target():
  with pytest.raises(ValueError, match="TPU target"):
    search.search(_small(), target="cpu:4")


@pytest.mark.slow
def test_a_real_search_on_a_v5e_finds_the_fewest_microbatches_that_fit():
  """The learn family compiled by XLA:TPU for a v5e-4 (everything of this small config fits):
  the most microbatches tried first, then bisection down to one microbatch without
  recomputation; no recomputing policy is tried (none could be faster below one microbatch);
  every candidate logged, each with its bound."""
  lines = []
  config = _small(rl__prompts_per_step=2, rl__group_size=2, rl__decode_slots=4)
  assert search.microbatch_choices(config) == [1, 2, 4]
  result = search.search(config, target="v5e-4", prompt_len=32, log=lines.append,
                         families=("learn",))
  assert result["learn"]["overrides"] == {"model.remat": "none", "rl.microbatches": 1}
  tried = [r["overrides"] for r in result["candidates"]]
  assert [o["rl.microbatches"] for o in tried] == [4, 1]   # the most, then bisection
  assert {o["model.remat"] for o in tried} == {"none"}
  assert all(r["fits"] and r["bound_s"] > 0 for r in result["candidates"])
  assert result["rollout"] is None and result["step"] is None and result["unfit"] == {}
  assert len(lines) == len(result["candidates"])
