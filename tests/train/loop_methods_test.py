"""Methods of the training loop, end to end at toy size: LoRA merged into the base every N steps
(ReLoRA), and the rollback to the last healthy checkpoint after N skipped updates in a row. The
runs share one tokenizer and SFT warm start."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from configs import toy
from flax import nnx
from rl_curriculum.model import transformer
from rl_curriculum.train import loop
from rl_curriculum.train.durable import checkpointing, recovery
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import prepare as prepare_lib
import test_util

# The caches a workdir keeps for its tokenizer and SFT warm start (`warm_start`), not its RL run.
# Wall-clock measurements differ between runs by nature; everything else must match exactly.
_TIMING = ("time/", "tokens_per_s")


def _lora_config(steps, merge_every=0):
  """The toy run with rank-4 adapters, a KL penalty in the reward against the adapters-off
  model, and a learning rate large enough for each update to move the adapters visibly."""
  c = toy.get_config()
  c.rl.steps = steps
  c.rl.learning_rate = 1e-3
  c.rl.kl_reward_coef = 0.1
  c.model.lora_rank = 4
  c.model.lora_merge_every = merge_every
  c.checkpoint.keep = 3  # every step's checkpoint stays (checkpoint.every = 1)
  # At this rate the toy policy turns uniform after one update (entropy ln V): the merges and
  # rollbacks of these tests are what they test, not what a collapse sets off.
  c.checkpoint.collapse_after = 0
  return c


def _deterministic(rows, drop=()):
  return [{k: v for k, v in r.items() if not k.startswith(_TIMING) and k not in drop}
          for r in rows]


def _saved(workdir, step):
  """The state checkpoint `step` holds, read back as it was written (nested dicts of arrays)."""
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return restored["state"]


def _flat(state):
  return {"/".join(map(str, path)): np.asarray(var.get_value())
          for path, var in nnx.to_flat_state(state)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
  """Two steps with adapters that are never merged."""
  workdir = str(tmp_path_factory.mktemp("loop_methods") / "plain")
  return workdir, test_util.run_rl(_lora_config(2), workdir)


@pytest.fixture(scope="module")
def merged(plain, tmp_path_factory):
  """Three steps of the same run with a merge after step 2."""
  workdir = str(tmp_path_factory.mktemp("loop_methods") / "merged")
  return workdir, test_util.run_rl(_lora_config(3, merge_every=2), workdir)


@pytest.mark.slow
def test_merge_keeps_the_policy_and_restarts_the_adapters(plain, merged):
  (plain_dir, plain_rows), (merged_dir, merged_rows) = plain, merged
  assert [r["lora_merged"] for r in merged_rows] == [0.0, 1.0, 0.0]
  assert "lora_merged" not in plain_rows[-1]
  # Up to the merge the runs are one run; the merge after step 2 leaves the greedy evaluation
  # that follows it (logged with step 2) exactly as it is without merging.
  assert any(k.startswith("eval/acc/") for k in plain_rows[1])
  assert (_deterministic(merged_rows[:2], drop=("lora_merged",))
          == _deterministic(plain_rows))
  # The same function: log-probs of the pool's prompts before (unmerged run) and after merging.
  config = _lora_config(3, merge_every=2)
  run = prepare_lib.prepare(config, merged_dir, log=lambda _: None)
  _, before = loop.restore_params(_lora_config(2), run, plain_dir)
  step, after = loop.restore_params(config, run, merged_dir, step=2)
  assert step == 2
  tokens, mask = run.pool.tokens[:16], run.pool.mask[:16]
  logp = [np.asarray(jax.nn.log_softmax(transformer.forward(run.model.graphdef, p, tokens, mask)))
          for p in (before, after)]
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(logp[1][valid], logp[0][valid], atol=1e-4)
  # B is 0 right after the merge and A was redrawn; the targeted base kernels moved, nothing else.
  adapters_before, adapters_after = _flat(before[0]), _flat(after[0])
  for name, value in adapters_after.items():
    if name.endswith("lora_b"):
      assert not np.any(value) and np.any(adapters_before[name]), name
    else:
      assert not np.allclose(value, adapters_before[name]), name
  base_before, base_after = _flat(before[1]), _flat(after[1])
  moved = sorted(n for n in base_before if not np.array_equal(base_before[n], base_after[n]))
  assert all(n.endswith(("attn/q/kernel", "attn/v/kernel")) for n in moved), moved
  assert {n[-len("q/kernel"):] for n in moved} == {"q/kernel", "v/kernel"}, moved
  # The optimizer restarted: the saved Adam moments and step count are all 0.
  opt_state = _saved(merged_dir, 2)["train"]["opt_state"]
  assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(opt_state))
  assert any(np.any(np.asarray(x)) for x in jax.tree.leaves(_saved(plain_dir, 2)["train"]
                                                              ["opt_state"]))
  # The KL reference is the adapters-off model: after step 1 the policy has left it; right after
  # the merge (B = 0) the policy is the reference and the KL in step 3's reward is 0.
  assert abs(merged_rows[1]["kl_reward"]) > 1e-6
  assert abs(merged_rows[2]["kl_reward"]) < 1e-6


@pytest.mark.slow
def test_adapter_health_is_reported_every_step(merged, tmp_path):
  merged_dir, rows = merged
  for r in rows[:2]:  # (in step 1 one of the two minibatches holds no advantage: no gradient)
    assert r["nonzero_adv_frac"] > 0
    assert r["adapter_grad_norm"] > 0 and r["adapter_update_norm"] > 0, r["step"]
    assert r["adapter_param_norm"] > 0 and r["adapter_frozen"] == 0.0, r["step"]
  assert rows[2]["adapter_param_norm"] > 0  # A, freshly drawn
  # Step 3 again from step 2's checkpoint, sampled at a temperature near 0: the completions of a
  # group are one greedy completion and earn one reward, and right after the merge the KL penalty
  # is 0. Nothing is left to learn: the adapters get no gradient and are reported frozen.
  workdir = str(tmp_path / "greedy")
  shutil.copytree(merged_dir, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))
  config = _lora_config(3, merge_every=2)
  config.rl.temperature = 1e-6
  greedy = test_util.run_rl(config, workdir, allow_config_change=True)[2]
  assert greedy["nonzero_adv_frac"] == 0.0 and abs(greedy["kl_reward"]) < 1e-6
  assert greedy["adapter_grad_norm"] == 0.0 and greedy["adapter_update_norm"] == 0.0
  assert greedy["adapter_frozen"] == 1.0 and greedy["adapter_param_norm"] > 0


@pytest.mark.slow
def test_resume_across_a_merge_reproduces_the_uninterrupted_run(merged, tmp_path):
  """The run stopped after step 2's merge and checkpoint resumes from the merged base."""
  merged_dir, merged_rows = merged
  workdir = str(tmp_path / "resumed")
  shutil.copytree(merged_dir, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))  # as if stopped after step 2
  rows = test_util.run_rl(_lora_config(3, merge_every=2), workdir)
  assert _deterministic(rows) == _deterministic(merged_rows)
  a, b = _saved(merged_dir, 3), _saved(workdir, 3)
  assert set(a) == {"train", "curriculum", "base"}
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_rollback_after_two_skipped_updates_restores_the_last_healthy_checkpoint(
    merged, tmp_path, capsys, monkeypatch):
  """The merged run resumed after step 2 with an optimizer whose every update is NaN (and the
  changed config allowed): every update is non-finite and skipped. After two in a row (steps 3,
  4) the run returns to the newest healthy checkpoint whose state precedes step 2's accepted
  update, step 1's (before the merge, so its base is the warm start's); two more (5, 6) find
  nothing older and carry on."""
  merged_dir, _ = merged
  workdir = str(tmp_path / "rollback")
  shutil.copytree(merged_dir, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))  # as if stopped after step 2
  config = _lora_config(6, merge_every=100)  # the base in the checkpoints, no merge in steps 3-6
  config.checkpoint.rollback_after = 2
  build_optimizer = builders.build_optimizer

  def nan_updates(*args, **kwargs):  # the optimizer's own state, its updates all NaN
    inner = build_optimizer(*args, **kwargs)

    def update(grads, state, params=None):
      updates, state = inner.update(grads, state, params)
      return jax.tree.map(lambda u: u * jnp.nan, updates), state
    return optax.GradientTransformation(inner.init, update)

  monkeypatch.setattr(builders, "build_optimizer", nan_updates)
  capsys.readouterr()
  rows = test_util.run_rl(config, workdir, allow_config_change=True)[2:]
  out = capsys.readouterr().out
  assert [r["update_skipped"] for r in rows] == [1.0] * 4
  assert [r["skip_streak"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
  assert [r["rollbacks"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
  assert ("2 updates in a row skipped: rolled back to the checkpoint of step 1 (its state from "
          "step 1); rollback 1") in out
  assert "no healthy checkpoint from before step 1 to roll back to" in out
  # The final state is step 1's, the counters excepted; the base is the one before the merge.
  final, first, second = _saved(workdir, 6), _saved(merged_dir, 1), _saved(merged_dir, 2)
  for name in ("params", "opt_state", "whitening"):
    for x, y in zip(jax.tree.leaves(final["train"][name]), jax.tree.leaves(first["train"][name])):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert int(final["train"]["step"]) == 6 and int(final["train"]["skipped"]) == 4
  for x, y in zip(jax.tree.leaves(final["base"]), jax.tree.leaves(first["base"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert not all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in
                 zip(jax.tree.leaves(final["base"]), jax.tree.leaves(second["base"])))
  # No periodic checkpoint during a streak (3, 5); step 4's holds the restored state.
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  metas = checkpointing.metadata(manager)
  manager.close()
  assert sorted(metas) == [2, 4, 6]
  assert recovery.from_meta(metas[4], 4) == recovery.Health(streak=0, origin=1, rollbacks=1)


@pytest.mark.slow
def test_a_collapsed_policy_stops_the_run_with_the_reason(tmp_path, monkeypatch):
  """A full fine-tune whose optimizer's every update erases the weights: after update 1 every
  logit is 0, the policy is uniform (entropy ln V), and KL(old || uniform) <= ln V stays under
  rl.max_kl, so no update is skipped. Steps 2 and 3 look collapsed, no checkpoint holds a state
  from before update 1, and the run stops after writing step 3's metrics."""
  config = _lora_config(5)
  config.model.lora_rank = 0
  config.rl.epochs = config.rl.minibatches = 1  # one update a step: step 1's measures the weights
  config.checkpoint.collapse_after = 2
  assert config.rl.max_kl > 2.773  # ln V, the most KL(old || uniform) can be
  warm = test_util.shared_warm_start(config)  # made by the real optimizer (SFT uses it too)
  build_optimizer = builders.build_optimizer

  def erasing(*args, **kwargs):  # the optimizer's own state; each update takes the weights to 0
    inner = build_optimizer(*args, **kwargs)

    def update(grads, state, params=None):
      _, state = inner.update(grads, state, params)
      return jax.tree.map(jnp.negative, params), state
    return optax.GradientTransformation(inner.init, update)

  monkeypatch.setattr(builders, "build_optimizer", erasing)
  workdir = str(tmp_path / "run")
  with pytest.raises(recovery.Collapsed, match=r"the policy collapsed: entropy 2\.773 nats at ln "
                     r"V = 2\.773 \(a uniform policy\), 2 steps in a row since step 2; stopped "
                     r"at step 3: no healthy checkpoint from before it is kept"):
    test_util.run_rl(config, workdir, warm_from=warm)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  assert [r["collapse_streak"] for r in rows[1:]] == [0.0, 1.0, 2.0]
  assert [r["update_skipped"] for r in rows[1:]] == [0.0, 0.0, 0.0]
  # Checkpoints pause while steps look collapsed: step 1's is the newest.
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))) == [1]


def test_a_discarded_update_keeps_the_prompt_statistics_as_it_keeps_the_curriculum_state(
    tmp_path, monkeypatch):
  """The rule for a discarded update (`loop.run_step`): everything the step's batch would have
  taught stays as it was. The counterfactual run keeps per-prompt statistics; its optimizer
  turns every update after step 1's two NaN, so step 2's update is skipped. Step 1 taught the
  statistics and SEC's values; after step 2 both are as step 1 left them (SEC's sampler cursors
  aside: the selection itself happened)."""
  config = toy.get_config()
  config.rl.algorithm = "counterfactual"
  config.rl.steps = 2
  test_util.shared_warm_start(config)  # made first: the SFT warm start uses no such optimizer
  build_optimizer = builders.build_optimizer

  def nan_after_step_1(*args, **kwargs):  # two optimizer steps a batch (rl.minibatches = 2)
    inner = build_optimizer(*args, **kwargs)

    def update(grads, state, params=None):
      # Adam's step count (a learning-rate schedule keeps a count of its own).
      adam = lambda x: isinstance(x, optax.ScaleByAdamState)
      count = next(x.count for x in jax.tree.leaves(state, is_leaf=adam) if adam(x))
      updates, state = inner.update(grads, state, params)
      return jax.tree.map(lambda u: jnp.where(count >= 2, jnp.nan, u), updates), state
    return optax.GradientTransformation(inner.init, update)

  monkeypatch.setattr(builders, "build_optimizer", nan_after_step_1)
  workdir = str(tmp_path / "run")
  rows = test_util.run_rl(config, workdir)
  assert [r["update_skipped"] for r in rows] == [0.0, 1.0]
  first, second = _saved(workdir, 1), _saved(workdir, 2)
  assert int(np.asarray(first["prompts"]["attempts"]).sum()) > 0  # step 1 observed its batch
  for x, y in zip(jax.tree.leaves(first["prompts"]), jax.tree.leaves(second["prompts"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for name in ("q", "visits", "last_mean_reward", "step"):
    np.testing.assert_array_equal(np.asarray(first["curriculum"][name]),
                                  np.asarray(second["curriculum"][name]), err_msg=name)
  assert np.any(np.asarray(first["curriculum"]["q"]))
