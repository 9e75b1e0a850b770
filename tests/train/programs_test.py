"""Tests of rl_curriculum/train/programs.py: one builder for the loop and the planner."""

import jax
import numpy as np
import pytest

from configs import toy
from rl_curriculum import curriculum as cur
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.train import builders, loop, pipeline, plan, prepare, programs, rollouts
import test_util


def _config(lora: bool, kl: str):
  """The toy config without SFT; LoRA adapters or full fine-tuning; no KL, a KL loss or a KL
  penalty in the reward."""
  c = toy.get_config()
  c.sft.steps = 0
  if lora:
    c.model.lora_rank = 4
  if kl == "loss":
    c.rl.kl_coef = 0.05
  elif kl == "reward":
    c.rl.kl_reward_coef = 0.05
  return c


def _first_rollout(config, workdir):
  """(run, programs, placed fresh run state, step 1's batch and rollout statistics, its learn
  key), as the loop's one rollout path (`pipeline`) makes them."""
  run = prepare.prepare(config, workdir, log=lambda _: None)
  mesh = prepare.run_mesh(config)
  progs, state = loop.fresh_state(config, run, mesh)
  root = prepare.rl_root_key(config)
  side = pipeline.rollout_side(config, prepare.rollout_mesh(config, mesh), mesh)
  steps = loop.Loop(config=config, run=run, programs=progs,
                    layout=rollouts.row_layout(config, mesh), ref=None, root=root, manager=None,
                    merge=None, log=lambda _: None, workdir=workdir, side=side)
  state = pipeline.attach(config, run, progs, side, root, programs.place(progs, state))
  params, before = pipeline.rollout_policy(steps, state), pipeline.engine_counters(state)
  state, _ = pipeline.finish(steps, pipeline.queue(steps, state, params, 1, 0), params, 1, 0)
  _, _, k_learn, k_filter = loop.step_keys(root, 1)
  batch, stats = pipeline.learn_batch(steps, state, 1, k_filter)
  stats.update(pipeline.decode_stats(config, before, pipeline.engine_counters(state), 1.0))
  return run, progs, state._replace(rollouts=None), batch, stats, k_learn


def _placed_learn_inputs(config, workdir):
  """The learn step's inputs for one step, as the loop builds and places them: a fresh run
  state, the KL reference, and a batch the loop's own rollout collected."""
  run, progs, state, batch, _, k_learn = _first_rollout(config, workdir)
  ref = programs.place_reference(progs, programs.reference(config, run.model))
  return run, programs.learn_inputs(state, batch, k_learn, ref)


def test_the_continuous_engine_collects_the_static_engines_batch(tmp_path):
  """The loop's rollout on 4 decode slots (halved once as the rows run out) holds the static
  engine's tokens, mask and scores, log-probs to 1e-5, for fewer slot-steps."""
  out = {}
  for engine in ("static", "continuous"):
    config = toy.get_config()  # its SFT warm start answers, so completions end at EOS
    config.rl.engine, config.rl.decode_slots, config.rl.decode_shrink = engine, 4, 1
    workdir = str(tmp_path / engine)
    test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
    out[engine] = jax.device_get(_first_rollout(config, workdir)[3:5])
  (static, static_stats), (cont, cont_stats) = out["static"], out["continuous"]
  for field in ("tokens", "mask", "rewards", "correct", "train_groups"):
    np.testing.assert_array_equal(getattr(cont, field), getattr(static, field), err_msg=field)
  np.testing.assert_allclose(cont.sampler_logprobs, static.sampler_logprobs, atol=1e-5, rtol=0)
  assert cont_stats["rollout/slot_steps"] < static_stats["rollout/slot_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("lora,kl", [(False, "none"), (False, "reward"), (False, "loss"),
                                     (True, "none"), (True, "loss")])
def test_the_planner_counts_the_bytes_the_loop_places(tmp_path, lora, kl):
  config = _config(lora, kl)
  run, inputs = _placed_learn_inputs(config, str(tmp_path))
  ref = inputs[-1]
  assert (ref is not None) == (not lora and kl != "none")  # a reference only when one is read
  placed = mesh_lib.shard_bytes(inputs)
  report = plan.plan(config, hbm_gib=1.0, prompt_len=run.pool.tokens.shape[1],
                     vocab_size=run.tokenizer.vocab_size, programs=("learn",))
  learn = report["programs"]["learn"]
  assert learn["argument_bytes"] == placed
  # XLA's count of the arguments the compiled program reads: jit drops inputs the program never
  # reads, here a few scalars; weights placed but never read (MiB) would show here.
  read = round(learn["argument_gib"] * plan.GIB)
  assert 0 <= placed - read < 1024


def test_a_reference_exists_exactly_when_something_reads_it():
  for lora in (False, True):
    for kl in ("none", "loss", "reward"):
      assert programs.needs_reference(_config(lora, kl)) == (not lora and kl != "none")


def test_abstract_and_placed_states_share_one_layout():
  """`abstract` describes a state with the shardings `place` gives it."""
  config = _config(lora=False, kl="none")
  graphdef, params = test_util.tiny_model()
  model = programs.Model(graphdef=graphdef, trainable=params, frozen=None)
  arms = len(config.task.train_bins)
  pool = cur.PromptPool.from_arms(np.arange(8 * arms) % arms)
  mesh = prepare.run_mesh(config)
  progs = programs.build(config, model, mesh, pool, programs.TokenIds(eos_id=1, pad_id=0))
  state = programs.init_run_state(config, progs, model, pool, jax.random.PRNGKey(0))
  placed, shapes = programs.place(progs, state), programs.abstract(progs, state)
  for x, s in zip(jax.tree.leaves(placed.train), jax.tree.leaves(shapes.train)):
    assert x.shape == s.shape and x.dtype == s.dtype and x.sharding.is_equivalent_to(
        s.sharding, x.ndim)
  arrays = lambda state: state._replace(health=None)  # health is host-side
  assert mesh_lib.shard_bytes(arrays(placed)) == mesh_lib.shard_bytes(arrays(shapes))


def test_runs_that_compute_the_same_step_share_its_jitted_functions(monkeypatch):
  """A second build of programs that compute what an earlier build's compute (the same learn
  settings, model, curriculum and pool; other seeds, lengths or evaluation settings) returns the
  same jitted select and learn, whose compiled programs JAX keeps; any difference in what they
  compute builds new ones."""
  graphdef, params = test_util.tiny_model()
  model = programs.Model(graphdef=graphdef, trainable=params, frozen=None)
  arms = len(toy.get_config().task.train_bins)
  pool = cur.PromptPool.from_arms(np.arange(8 * arms) % arms)
  tokens = programs.TokenIds(eos_id=1, pad_id=0)

  def build(pool=pool, **fields):
    config = _config(lora=False, kl="none")
    for name, value in fields.items():
      section, field = name.split("__")
      setattr(getattr(config, section), field, value)
    progs = programs.build(config, model, prepare.run_mesh(config), pool, tokens)
    return progs.select, progs.learn

  first = build()
  assert build(rl__seed=3, rl__steps=9, eval__every=1, checkpoint__every=2) == first
  different = [build(rl__entropy_coef=0.01), build(rl__learning_rate=1e-3),
               build(curriculum__options={"temperature": 0.5}),
               build(curriculum__name="uniform", curriculum__options={}),
               build(pool=cur.PromptPool.from_arms(np.arange(8 * arms) % arms,
                                                   difficulty=np.arange(8 * arms) * 0.5))]
  for n, fns in enumerate(different):
    assert fns[1] is not first[1], n
    assert all(fns[1] is not other[1] for other in different[n + 1:]), n
  # An optimizer made by another function (a test's stand-in) makes another learn step.
  build_optimizer = builders.build_optimizer
  monkeypatch.setattr(builders, "build_optimizer", lambda *a, **k: build_optimizer(*a, **k))
  assert build()[1] is not first[1]
