"""Tests of rl_curriculum/train/programs.py: one builder for the loop and the planner."""

import jax
import ml_collections
import numpy as np
import pytest

from configs import toy
from rl_curriculum import curriculum as cur
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.plan import planner as plan
from rl_curriculum.train import loop, programs
from rl_curriculum.train.learn import examples
from rl_curriculum.train.rollout import pipeline
from rl_curriculum.train.rollout import batches
from rl_curriculum.train.setup import builders, prepare
from rl_curriculum.train.setup import validation
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
                    layout=batches.row_layout(config, mesh), ref=None, root=root, manager=None,
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
  return run, programs.learn_inputs(progs, state, batch, k_learn, ref)


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
  ref = inputs[-2]  # the last input is the learn config
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


def test_builds_of_one_spec_share_jitted_functions_and_any_other_spec_makes_new_ones(
    monkeypatch):
  """A second build whose programs are made from an equal `ProgramSpec` (another seed, length,
  evaluation setting, or coefficient: a learning rate, an entropy weight, SEC's temperature)
  returns the same jitted select and learn, whose compiled programs JAX keeps; another
  curriculum, its structural options, pool or a replaced maker builds new ones."""
  graphdef, params = test_util.tiny_model()
  model = programs.Model(graphdef=graphdef, trainable=params, frozen=None)
  arms = len(toy.get_config().task.train_bins)
  pool = cur.PromptPool.from_arms(np.arange(8 * arms) % arms)
  tokens = programs.TokenIds(eos_id=1, pad_id=0)

  def build(pool=pool, **fields):
    config = test_util.set_fields(_config(lora=False, kl="none"), **fields)
    progs = programs.build(config, model, prepare.run_mesh(config), pool, tokens)
    return progs.select.func, progs.learn

  first = build()
  for same in (dict(rl__seed=3, rl__steps=9, eval__every=1, checkpoint__every=2),
               dict(rl__learning_rate=1e-3, rl__entropy_coef=0.01, rl__eps_high=0.2),
               dict(curriculum__options={"temperature": 0.5, "alpha": 0.9, "unsampled": "keep",
                                         "objective": "abs_advantage"})):
    assert build(**same) == first, same
  different = [build(curriculum__options={"objective": "learning_progress"}),
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


def test_configs_that_differ_in_coefficients_run_one_compiled_program_to_their_own_results():
  """Two configs that differ only in numeric coefficients (learning rate, clip bounds, ratio
  guard, KL bound, SEC's step size and temperature) take one compiled learn program, and each
  gets the update it gets alone: the same step again on a learn function built afresh (a cold
  jit cache: `jax.clear_caches`) gives every leaf bit for bit."""
  graphdef, params = test_util.tiny_model()
  model = programs.Model(graphdef=graphdef, trainable=params, frozen=None)
  base = _config(lora=False, kl="none")
  arms = len(base.task.train_bins)
  pool = cur.PromptPool.from_arms(np.arange(8 * arms) % arms)
  batch = _tiny_batch(base)
  variants = {
      "a": {},
      "b": dict(rl__learning_rate=3e-3, rl__eps_low=0.1, rl__eps_high=0.4,
                rl__ratio_guard=4.0, rl__max_kl=2.0,
                curriculum__options={"alpha": 0.9, "temperature": 0.7, "unsampled": "keep",
                                     "objective": "abs_advantage"})}

  def step(fields):
    config = test_util.set_fields(base.copy_and_resolve_references(), **fields)
    progs = programs.build(config, model, prepare.run_mesh(config), pool,
                           programs.TokenIds(eos_id=1, pad_id=0))
    state = programs.place(progs, programs.init_run_state(config, progs, model, pool,
                                                          jax.random.PRNGKey(0)))
    out = progs.learn(*programs.learn_inputs(progs, state, batch, jax.random.PRNGKey(1), None))
    return progs.learn, jax.device_get(out)

  shared = {name: step(fields) for name, fields in variants.items()}
  learn = shared["a"][0]
  assert shared["b"][0] is learn and learn._cache_size() == 1  # pylint: disable=protected-access
  moved = lambda out: out[0].params
  assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(moved(shared["a"][1])),
                                                      jax.tree.leaves(moved(shared["b"][1]))))
  for name, fields in variants.items():
    jax.clear_caches()
    programs._jitted.cache_clear()  # pylint: disable=protected-access
    alone = step(fields)
    assert alone[0] is not learn
    for x, y in zip(jax.tree.leaves(alone[1]), jax.tree.leaves(shared[name][1]), strict=True):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def _tiny_batch(config):
  """A scored batch of the toy config's shapes for the tiny model (random tokens and rewards)."""
  p, g = config.rl.prompts_per_step, config.rl.group_size
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (p, g)).astype(np.float32)
  prompts = np.repeat(rng.integers(4, test_util.V, (p, 5)), g, axis=0).astype(np.int32)
  tokens = rng.integers(4, test_util.V, (p * g, config.rl.max_new_tokens)).astype(np.int32)
  return examples.make_batch(prompts, tokens, rewards, num_arms=len(config.task.train_bins))


# Config fields the key test below leaves as they are: the run's identity and process layout, a
# checkpoint on disk, and another preset (another model, whose graph is part of the key).
_NOT_PERTURBED = ("model.source", "model.preset", "parallel.coordinator_address",
                  "parallel.process_id", "parallel.num_processes", "parallel.mesh_shape",
                  "parallel.rollout_devices", "task.name", "task.options", "task.weights")
# Fields that only validate together with others: what to set with them.
_JOINT = {"curriculum.filter": {"curriculum.oversample": 2.0},
          "curriculum.oversample": {"curriculum.filter": "all_equal"},
          "curriculum.band": {"curriculum.filter": "accuracy_band", "curriculum.oversample": 2.0},
          "curriculum.high_variance_only": {"curriculum.name": "vcrl",
                                            "curriculum.options": {}},
          "curriculum.name": {"curriculum.options": {}},
          "curriculum.arms": {"task.name": "arithmetic+countdown",
                              "task.train_bins": (0, 1, 12, 13), "task.eval_bins": (0, 12)},
          "model.lora_merge_every": {"model.lora_rank": 4},
          "rl.decode_budget": {"rl.engine": "continuous"},
          "rl.page_size": {"rl.engine": "continuous"},
          "rl.kv_pages": {"rl.engine": "continuous", "rl.page_size": 2},
          "rl.rollback": {"rl.max_kl": 0.0},
          "rl.max_staleness": {"rl.engine": "continuous", "rl.off_policy_correction": "none"}}


def _leaf_fields(config, prefix=""):
  """(path, value) of every leaf field of a ConfigDict (curriculum.options' entries included)."""
  for name, value in config.items():
    path = f"{prefix}{name}"
    if isinstance(value, ml_collections.ConfigDict) and (value or not prefix):
      yield from _leaf_fields(value, path + ".")
    else:
      yield path, value


def _other_values(path, value):
  """Values to try in place of `value` (the first that validates, with the `_JOINT` fields it
  needs, is used)."""
  if isinstance(value, bool):
    return [not value]
  if isinstance(value, int):
    return [value + 1, value * 2, value - 1, 0, 1, 2]
  if isinstance(value, float):
    return [value * 1.5 + 0.1, value * 0.5, value + 1.0, 0.5, 2.0, 3.0]
  if isinstance(value, str):
    return {"rl.engine": ["continuous"], "rl.admission": ["drop"], "rl.proximal": ["loglinear"],
            "rl.level": ["sequence"], "rl.aggregation": ["seq_mean_token_mean"],
            "rl.kl_estimator": ["k2"], "rl.algorithm": ["grpo"], "rl.grpo_std": ["sample"],
            "rl.overlong": ["exclude"], "rl.allocation": ["uniform"],
            "curriculum.feedback": ["reward"], "curriculum.name": ["uniform"],
            "curriculum.arms": ["task"], "curriculum.filter": ["all_equal"],
            "curriculum.options.unsampled": ["decay"],
            "curriculum.options.objective": ["learning_progress"],
            "model.dtype": ["bfloat16"], "model.param_dtype": ["bfloat16"],
            "model.remat": ["block"], "task.template": ["chat"],
            "tokenizer.model_type": ["bpe"], "checkpoint.on_collapse": ["stop"],
            "rl.off_policy_correction": ["none"], "model.attention": ["tpu"],
            "model.kv_dtype": ["float32"],
            "rl.rollback": ["minibatch"], "curriculum.horizon": ["linear"],
            "rl.credit": ["turn"], "parallel.rollout_layout": ["replicated"],
            "task.held_out_split": ["validation"]}.get(path, [])
  if isinstance(value, tuple):
    return {"curriculum.band": [(0.2, 0.8)]}.get(path, [value[:-1]] if len(value) > 1 else [])
  return []


def _set(config, path, value):
  *sections, name = path.split(".")
  node = config
  for section in sections:
    node = node[section]
  node[name] = value


def _learn_key_and_text(config, lower: bool):
  """(what selects the compiled learn program: its functions' spec and its inputs' structure,
  shapes, dtypes and shardings; the lowered program's text when `lower`) of `config` at toy size,
  from abstract shapes."""
  if lower:  # traced afresh, not from a cache keyed by what this test questions
    jax.clear_caches()
    programs._jitted.cache_clear()  # pylint: disable=protected-access
  shape = plan.model_shape(config, vocab_size=64)
  model = plan.abstract_model(config, shape)
  mesh = prepare.run_mesh(config)
  inputs = plan.abstract_inputs(config, model, mesh, prompt_len=8)
  args = programs.learn_inputs(inputs.programs, inputs.state, plan.abstract_batch(config, inputs),
                               inputs.key, inputs.ref)
  leaves, treedef = jax.tree.flatten(args)
  avals = tuple((np.shape(x), str(getattr(x, "dtype", type(x))),
                 getattr(x, "sharding", None)) for x in leaves)
  key = (inputs.programs.spec, treedef, avals)
  text = inputs.programs.learn.lower(*args).as_text() if lower else None
  return key, text


def test_a_config_field_that_changes_the_learn_program_changes_its_key():
  """The compiled learn program is selected by its `ProgramSpec` and the structure, shapes and
  shardings of its inputs (the `LearnConfig`'s static fields among them): every config field is
  set to another valid value in turn, and those that leave that key as it is are set together
  (in as few compatible groups as validate) and must leave the lowered program's text as it is.
  A field read by the learn program but left out of the key (a closure over the config, a
  constant of the program) fails here."""
  base = toy.get_config()
  base_key, base_text = _learn_key_and_text(base, lower=True)
  kept, changed, untried = [], [], []
  for path, value in _leaf_fields(base):
    if path.startswith(_NOT_PERTURBED):
      continue
    for other in _other_values(path, value):
      if other == value:
        continue
      config = _with(base, {path: other, **_JOINT.get(path, {})})
      try:
        validation.validate(config, check_source=False)
      except validation.ConfigError:
        continue
      key, _ = _learn_key_and_text(config, lower=False)
      (changed if key != base_key else kept).append((path, other))
      break
    else:
      untried.append(path)
  assert len(changed) >= 35 and len(kept) >= 50, (changed, kept)
  assert not untried, untried
  groups = []
  for path, other in kept:  # greedy: join the first group that still validates
    for group in groups:
      config = _with(base, dict(group + [(path, other)]))
      try:
        validation.validate(config, check_source=False)
      except validation.ConfigError:
        continue
      group.append((path, other))
      break
    else:
      groups.append([(path, other)])
  for group in groups:
    key, text = _learn_key_and_text(_with(base, dict(group)), lower=True)
    assert key == base_key, group
    if text != base_text:  # name the field
      culprits = [p for p, v in group if _learn_key_and_text(
          _with(base, {p: v}), lower=True)[1] != base_text]
      pytest.fail(f"these fields change the compiled learn program but not its key: {culprits}")


def _with(config, fields: dict):
  """A copy of `config` with {path: value} set."""
  config = config.copy_and_resolve_references()
  for path, value in fields.items():
    _set(config, path, value)
  return config
