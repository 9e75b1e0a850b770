"""Deliberate one-line mutations of rl_curriculum, each with the tests expected to catch it.

Each `Mutation` replaces `old` (which must occur exactly once in `file`) by `new`: a realistic
bug (a flipped sign, an off-by-one, a wrong operand), never a syntax error. `tests` is the pytest
selection (files or node ids, relative to the repository root) that should fail under it.

Apply them with `run.py` in this folder, in a clean checkout that is not being edited:

  python tests/mutations/run.py --repo /path/to/checkout --list
  nice -n 15 python tests/mutations/run.py --repo /path/to/checkout \
      --out tests/mutations/baseline.json

baseline.json holds the run of these 34 mutations on the suite before its second cut (the
methods table training every row; commit 224eb3a), after.json the run on the suite after it (the
methods table checking every row's flags without training and one step per family of methods,
the equivalence and end-to-end tests merged): every mutation is caught in both.
"""

from typing import NamedTuple


class Mutation(NamedTuple):
  """One deliberate bug."""
  id: str            # short name, used by run.py --only
  breaks: str        # the behaviour it breaks, one line
  file: str          # path relative to the repository root
  old: str           # text replaced; occurs exactly once in `file`
  new: str           # replacement
  tests: tuple       # pytest selection expected to catch it


_LOOP = "tests/train/loop_test.py::test_resume_equals_uninterrupted_run"
_ROLLBACK = ("tests/train/loop_methods_test.py::"
             "test_rollback_after_two_skipped_updates_restores_the_last_healthy_checkpoint")
_INFLIGHT_VERSIONS = ("tests/sampling/inflight_test.py::"
                      "test_each_token_carries_the_version_of_the_weights_that_drew_it")
_DISCARDED = ("tests/train/loop_methods_test.py::"
              "test_a_discarded_update_keeps_the_prompt_statistics_as_it_keeps_the_curriculum_state")

MUTATIONS = (
    Mutation(
        "rloo_count", "RLOO's leave-one-out factor n / (n - 1) becomes n / (n + 1)",
        "rl_curriculum/rl/advantages.py",
        "scale = jnp.where(n >= 2.0, n / jnp.maximum(n - 1.0, 1.0), 0.0)",
        "scale = jnp.where(n >= 2.0, n / jnp.maximum(n + 1.0, 1.0), 0.0)",
        ("tests/rl/advantages_test.py",)),
    Mutation(
        "gae_lambda", "GAE's recursion drops lambda: A_t = delta_t + gamma A_{t+1}",
        "rl_curriculum/rl/advantages.py",
        "a_t = m_t * (delta_t + gamma * lam * carry)",
        "a_t = m_t * (delta_t + gamma * carry)",
        ("tests/rl/advantages_test.py",)),
    Mutation(
        "sec_td_sign", "SEC's TD(0) step moves Q away from the arm reward",
        "rl_curriculum/curriculum/sec.py",
        "target = q + alpha * (arm_reward - q)",
        "target = q + alpha * (q - arm_reward)",
        ("tests/curriculum/sec_test.py",)),
    Mutation(
        "sec_temperature", "SEC's Boltzmann logits multiply Q by the temperature",
        "rl_curriculum/curriculum/sec.py",
        "logits = jnp.where(allowed, q / temperature, -jnp.inf)",
        "logits = jnp.where(allowed, q * temperature, -jnp.inf)",
        ("tests/curriculum/sec_test.py",)),
    Mutation(
        "ppo_clip_high", "the PPO ratio's upper clip bound uses eps_low instead of eps_high",
        "rl_curriculum/rl/surrogate.py",
        "clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)",
        "clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_low)",
        ("tests/rl/losses_test.py", "tests/rl/surrogate_test.py")),
    Mutation(
        "kl_k3", "k3 loses its -1: exp(x) - x instead of exp(x) - x - 1 (KL 1 at the reference)",
        "rl_curriculum/rl/surrogate.py",
        "return jnp.expm1(log_ratio_ref) - log_ratio_ref",
        "return jnp.exp(log_ratio_ref) - log_ratio_ref",
        ("tests/rl/losses_test.py", "tests/rl/surrogate_test.py")),
    Mutation(
        "token_mean_normaliser", "token_mean divides by every token slot, padding included",
        "rl_curriculum/rl/losses.py",
        "return jnp.maximum(jnp.sum(m), 1e-8)",
        "return jnp.maximum(jnp.float32(m.size), 1e-8)",
        ("tests/rl/losses_test.py",)),
    Mutation(
        "whitening_mean", "the running reward mean weights the batch by the old count",
        "rl_curriculum/rl/stability.py",
        "mean = jnp.where(n_b > 0, mean_a + delta * n_b / safe_n, mean_a)",
        "mean = jnp.where(n_b > 0, mean_a + delta * n_a / safe_n, mean_a)",
        ("tests/rl/stability_test.py",)),
    Mutation(
        "filter_all_right", "the dynamic filter keeps groups whose completions are all right",
        "rl_curriculum/curriculum/filters.py",
        "keep = (s > 0) & (s < n)",
        "keep = (s > 0) & (s <= n)",
        ("tests/curriculum/filters_test.py",)),
    Mutation(
        "answer_first_marker", "the chat verifier reads the first 'Answer:' line, not the last",
        "rl_curriculum/tasks/base.py",
        "m = matches[-1]",
        "m = matches[0]",
        ("tests/tasks/base_test.py", "tests/tasks/arithmetic_test.py")),
    Mutation(
        "extract_number_ambiguous", "an answer listing several numbers is read as its first one",
        "rl_curriculum/tasks/parsing.py",
        "if len(tokens) != 1:\n    return None\n  return parse_number(tokens[0])",
        "if not tokens:\n    return None\n  return parse_number(tokens[0])",
        ("tests/tasks/parsing_test.py", "tests/tasks/arithmetic_test.py")),
    Mutation(
        "lora_scale", "the LoRA update is scaled by rank / alpha instead of alpha / rank",
        "rl_curriculum/model/lora.py",
        "return self.alpha / self.rank",
        "return self.rank / self.alpha",
        ("tests/model/lora_test.py",)),
    Mutation(
        "decode_position", "the sampler does not advance the rotary position after a token",
        "rl_curriculum/sampling/sampler.py",
        "positions=s.positions + 1)",
        "positions=s.positions)",
        ("tests/sampling/sampler_test.py",)),
    Mutation(
        "sampler_logprob_temperature", "recorded log-probs ignore the sampling temperature",
        "rl_curriculum/sampling/strategies.py",
        "scaled = scaled.astype(jnp.float32)",
        "scaled = logits.astype(jnp.float32)",
        ("tests/sampling/strategies_test.py", "tests/sampling/sampler_test.py")),
    Mutation(
        "held_out_split", "trained bins draw their held-out sets from the trainable prompts",
        "rl_curriculum/train/setup/data.py",
        "exclude=is_trainable if trained else None)",
        "exclude=is_held_out if trained else None)",
        ("tests/train/setup/data_test.py",)),
    Mutation(
        "rollback_due", "a rollback needs one skipped update more than rollback_after",
        "rl_curriculum/train/durable/recovery.py",
        "return rollback_after > 0 and health.streak >= rollback_after",
        "return rollback_after > 0 and health.streak > rollback_after",
        ("tests/train/durable/recovery_test.py", _ROLLBACK)),
    Mutation(
        "resume_step", "a resumed run repeats the step its checkpoint was saved after",
        "rl_curriculum/train/loop.py",
        "for step in range(start + 1, config.rl.steps + 1):",
        "for step in range(start, config.rl.steps + 1):",
        (_LOOP,)),
    Mutation(
        "resume_curriculum", "a resumed run keeps a fresh curriculum state, not the checkpoint's",
        "rl_curriculum/train/state.py",
        'return state._replace(train=tree["train"], curriculum=tree["curriculum"],',
        'return state._replace(train=tree["train"], curriculum=state.curriculum,',
        (_LOOP,)),
    # The rollout engine: slot refill, version tags, the staleness bound, admission.
    Mutation(
        "slot_refill", "a free slot skips the next queued row and takes the one after it",
        "rl_curriculum/sampling/slots.py",
        "position = state.taken[:, None] + jnp.cumsum(free, axis=1, dtype=jnp.int32) - 1",
        "position = state.taken[:, None] + jnp.cumsum(free, axis=1, dtype=jnp.int32)",
        ("tests/sampling/continuous_test.py",)),
    Mutation(
        "first_token_version", "a row's first token is tagged version 0, not its prefill's",
        "rl_curriculum/sampling/slots.py",
        "versions=first_column(state.versions, first.version, 0),",
        "versions=first_column(state.versions, 0, 0),",
        (_INFLIGHT_VERSIONS,)),
    Mutation(
        "loop_token_version", "a token drawn in the loop is tagged one version too new",
        "rl_curriculum/sampling/continuous.py",
        "s = slots_lib.record(s._replace(cache=cache), token, logprob, version, stops)",
        "s = slots_lib.record(s._replace(cache=cache), token, logprob, version + 1, stops)",
        (_INFLIGHT_VERSIONS, "tests/train/rollout/pipeline_test.py")),
    Mutation(
        "staleness_versions", "rows in flight at k = 1 reach the learn step without versions",
        "rl_curriculum/train/rollout/pipeline.py",
        "  return config.rl.max_staleness > 0\n",
        "  return config.rl.max_staleness > 1\n",
        ("tests/train/rollout/pipeline_test.py",)),
    Mutation(
        "evict_passes_over", "an evicted generation's queued rows stay queued and are seated later",
        "rl_curriculum/sampling/inflight.py",
        "taken=jnp.maximum(state.taken, state.queue_end[:, generation]))",
        "taken=state.taken)",
        ("tests/sampling/inflight_test.py", "tests/train/rollout/pipeline_test.py")),
    Mutation(
        "admission_complete", "a group counts as complete once any of its rows stopped",
        "rl_curriculum/train/rollout/pipeline.py",
        "return np.all(done | ~valid, axis=1)",
        "return np.any(done & valid, axis=1)",
        ("tests/train/rollout/pipeline_test.py",)),
    # Rollouts in flight must choose an off-policy correction; a discarded update rolls back.
    Mutation(
        "off_policy_check", "stale tokens pass the config check with no correction named",
        "rl_curriculum/train/rollout/checks.py",
        'corrected = rl.tis_cap > 0 or rl.proximal == "loglinear"',
        'corrected = rl.tis_cap >= 0 or rl.proximal == "loglinear"',
        ("tests/train/setup/validation_test.py",)),
    Mutation(
        "skipped_update_prompts", "a discarded update keeps the per-prompt statistics it taught",
        "rl_curriculum/train/loop.py",
        '  if learned["update_skipped"]:\n    state = state._replace(prompts=prompts)\n',
        "",
        (_DISCARDED,)),
    # Checkpoint sealing and resume.
    Mutation(
        "checksum_ignored", "a checkpoint whose bytes changed passes verification",
        "rl_curriculum/train/durable/checkpointing.py",
        "    if found[rel][1] != digest:",
        "    if found[rel][1] != digest and False:",
        ("tests/train/durable/checkpointing_test.py",)),
    Mutation(
        "resume_in_flight", "a checkpoint leaves out the rows in flight",
        "rl_curriculum/train/state.py",
        "  if state.rollouts is not None:\n    tree[\"rollouts\"] = state.rollouts",
        "  if False:\n    tree[\"rollouts\"] = state.rollouts",
        ("tests/train/rollout/pipeline_test.py::"
         "test_resumed_with_rows_in_flight_equals_uninterrupted_k1",)),
    # The curricula's updates.
    Mutation(
        "ema_rate", "a teacher's running success moves away from the observation",
        "rl_curriculum/curriculum/arms.py",
        "new = jnp.where(seen, est + rate * (obs - est), obs)",
        "new = jnp.where(seen, est + rate * (est - obs), obs)",
        ("tests/curriculum/teachers_test.py", "tests/curriculum/arms_test.py")),
    Mutation(
        "dump_counts", "DUMP counts each sampled arm once more than it was drawn",
        "rl_curriculum/curriculum/dump.py",
        "counts = state.counts + arms_lib.arm_counts(feedback.arms, num_arms).astype(jnp.int32)",
        "counts = state.counts + 1 + arms_lib.arm_counts(feedback.arms, num_arms).astype("
        "jnp.int32)",
        ("tests/curriculum/dump_test.py",)),
    Mutation(
        "prompt_streak", "a zero-variance streak restarts at 0 instead of 1",
        "rl_curriculum/curriculum/prompt_stats.py",
        "streak = jnp.where(continues, store.streak + 1, jnp.where(kind != KIND_NONE, 1, 0))",
        "streak = jnp.where(continues, store.streak + 1, 0)",
        ("tests/curriculum/prompt_stats_test.py",)),
    # The verifiers.
    Mutation(
        "countdown_numbers", "countdown accepts an answer that uses a number twice",
        "rl_curriculum/tasks/countdown.py",
        "numbers_ok = used == have if problem.meta.get(\"use_all\", True) else not used - have",
        "numbers_ok = set(used) == set(have) if problem.meta.get(\"use_all\", True) else "
        "not used - have",
        ("tests/tasks/countdown_test.py",)),
    # Traced coefficients and the programs' key.
    Mutation(
        "switch_off_at_zero", "a coefficient of 0 stays on (a traced 0) instead of None",
        "rl_curriculum/train/learn/rl_types.py",
        "and not isinstance(value, bool) and value == 0):",
        "and not isinstance(value, bool) and value == -1):",
        ("tests/train/setup/builders_test.py", "tests/train/programs_test.py")),
    Mutation(
        "spec_pool", "builds over other pools share one jitted curriculum",
        "rl_curriculum/train/programs.py",
        "curriculum=(name, options, builders.sampled_prompts(config)), pool=ByValue(pool),",
        "curriculum=(name, options, builders.sampled_prompts(config)), pool=ByValue(None),",
        ("tests/train/programs_test.py",)),
)
