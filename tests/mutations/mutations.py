"""Deliberate one-line mutations of rl_curriculum, each with the tests expected to catch it.

Each `Mutation` replaces `old` (which must occur exactly once in `file`) by `new`: a realistic
bug (a flipped sign, an off-by-one, a wrong operand), never a syntax error. `tests` is the pytest
selection (files or node ids, relative to the repository root) that should fail under it.

Apply them with `run.py` in this folder, in a clean checkout that is not being edited:

  python tests/mutations/run.py --repo /path/to/checkout --list
  nice -n 15 python tests/mutations/run.py --repo /path/to/checkout \
      --out tests/mutations/baseline.json

baseline.json holds the run before the test suite was made to compile and train once per run
(shared warm starts, the compilation cache, the methods table in one process), after.json the
run after it: every mutation is caught in both.
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
        "rl_curriculum/sampling/sampler.py",
        "scaled = s.logits if greedy else strategies.apply_temperature(s.logits, temperature)",
        "scaled = s.logits",
        ("tests/sampling/sampler_test.py",)),
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
)
