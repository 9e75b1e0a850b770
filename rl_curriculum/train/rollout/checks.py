"""The rollout side of a run's config, checked: the engine, its decode slots and prefill chunk,
rollouts in flight across steps (staleness bound, decode budget, admission) and the rollout mesh.

  validate(config)                          # part of `validation.validate`: no device touched
  check_decode_slots(config, batch_shards)  # once the mesh is known
  check_prefill_chunk(config, prompt_len)   # once the data is built
  split_devices(config, devices)            # (learner devices, rollout devices) of this run

Each check raises `errors.ConfigError` naming the field.
"""

from typing import Sequence

import ml_collections

from rl_curriculum.curriculum import horizon as horizon_lib
from rl_curriculum.parallel import rollout_layout
from rl_curriculum.rl.credit import CREDITS
from rl_curriculum.sampling import pages
from rl_curriculum.sampling.continuous import ENGINES
from rl_curriculum.sampling.inflight import ADMISSIONS
from rl_curriculum.train.setup.errors import fail

__all__ = ["OFF_POLICY_CORRECTIONS", "in_flight", "turn_width", "validate",
           "validate_episodes", "check_decode_slots", "check_prefill_chunk", "split_devices"]

# rl.off_policy_correction: "required" (rollouts in flight must say how the learn step corrects
# for the older weights that drew a batch) or "none" (they train uncorrected, on purpose).
OFF_POLICY_CORRECTIONS = ("required", "none")


def in_flight(config: ml_collections.ConfigDict) -> bool:
  """Whether the run keeps rollouts in flight across steps (`train.rollout.pipeline`): batches sampled
  ahead (rl.max_staleness > 0), partial rollouts (rl.decode_budget > 0) or a rollout mesh apart
  from the learner's (parallel.rollout_devices > 0). Otherwise each step samples its own batch."""
  return (config.rl.max_staleness > 0 or config.rl.decode_budget > 0
          or config.parallel.rollout_devices > 0)


def turn_width(config: ml_collections.ConfigDict, task) -> int:
  """H: the most turns an episode of the run takes, rl.max_turns or fewer when the task's own
  episodes are shorter (`Task.turn_budget`: 1 for a single-turn task)."""
  return max(1, min(config.rl.max_turns, task.turn_budget))


def _whole(value, minimum: int) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def validate(config: ml_collections.ConfigDict) -> None:
  """The engine's fields (a known engine, slots >= 1, halvings and a prefill chunk >= 0; the mesh
  and the prompt buffer are checked where they are known) and those of rollouts in flight."""
  rl = config.rl
  if rl.engine not in ENGINES:
    fail("rl.engine", f"must be one of {ENGINES}, got {rl.engine!r}")
  if not _whole(rl.decode_slots, 1):
    fail("rl.decode_slots", f"must be a whole number >= 1 (decode slots of the continuous "
         f"engine), got {rl.decode_slots!r}")
  if not _whole(rl.decode_shrink, 0):
    fail("rl.decode_shrink", f"must be a whole number >= 0 (halvings of the decode slots, 0 = "
         f"fixed), got {rl.decode_shrink!r}")
  if not _whole(rl.prefill_chunk, 0):
    fail("rl.prefill_chunk", f"must be a whole number >= 0 (0 = the whole prompt), got "
         f"{rl.prefill_chunk!r}")
  if not _whole(rl.page_size, 0):
    fail("rl.page_size", f"must be a whole number >= 0 (tokens a KV page; 0 = the dense cache), "
         f"got {rl.page_size!r}")
  if not _whole(rl.kv_pages, 0):
    fail("rl.kv_pages", f"must be a whole number >= 0 (completion pages; 0 = as many as every "
         f"slot running to rl.max_new_tokens needs), got {rl.kv_pages!r}")
  if rl.page_size and rl.engine != "continuous":
    fail("rl.page_size", "a paged KV cache is the continuous engine's: set rl.engine="
         "'continuous' or rl.page_size = 0")
  if rl.kv_pages and not rl.page_size:
    fail("rl.kv_pages", "counts pages of a paged cache: set rl.page_size > 0 too")
  if not _whole(rl.max_staleness, 0):
    fail("rl.max_staleness", f"must be a whole number >= 0 (policy versions a trained token may "
         f"lag; 0 = synchronous), got {rl.max_staleness!r}")
  if not _whole(rl.decode_budget, 0):
    fail("rl.decode_budget", f"must be a whole number >= 0 (decode iterations a step; 0 = until "
         f"every queued row stops), got {rl.decode_budget!r}")
  if rl.admission not in ADMISSIONS:
    fail("rl.admission", f"must be one of {ADMISSIONS}, got {rl.admission!r}")
  if rl.off_policy_correction not in OFF_POLICY_CORRECTIONS:
    fail("rl.off_policy_correction", f"must be one of {OFF_POLICY_CORRECTIONS}, got "
         f"{rl.off_policy_correction!r}")
  if not _whole(config.parallel.rollout_devices, 0):
    fail("parallel.rollout_devices", f"must be a whole number >= 0 (0 = the learner's devices "
         f"sample too), got {config.parallel.rollout_devices!r}")
  _validate_layout(config.parallel)
  _validate_episode_fields(config)
  if not in_flight(config):
    return
  if rl.engine != "continuous":
    fail("rl.engine", "rollouts in flight across steps (rl.max_staleness, rl.decode_budget or "
         "parallel.rollout_devices > 0) live in the continuous engine: set rl.engine="
         "'continuous'")
  _validate_off_policy(rl)
  if rl.admission == "drop" and (rl.max_staleness < 1 or rl.decode_budget < 1):
    fail("rl.admission", "'drop' evicts a batch's rows that have not stopped when its step "
         "comes, which needs partial rollouts: rl.max_staleness >= 1 and rl.decode_budget >= 1 "
         f"(got {rl.max_staleness} and {rl.decode_budget})")
  if rl.temperature_target > 0:
    fail("rl.temperature_target", "the adaptive temperature moves with every update, and a "
         "batch in flight was sampled at an older one than the learn step would read: use it "
         "with rl.max_staleness = rl.decode_budget = parallel.rollout_devices = 0")


def _validate_layout(parallel: ml_collections.ConfigDict) -> None:
  """The engine's layout of the weights on the learner's devices (`parallel.rollout_layout`)."""
  if parallel.rollout_layout not in rollout_layout.LAYOUTS:
    fail("parallel.rollout_layout", f"must be one of {rollout_layout.LAYOUTS}, got "
         f"{parallel.rollout_layout!r}")
  if not _whole(parallel.rollout_tensor, 1):
    fail("parallel.rollout_tensor", f"must be a whole number >= 1 (devices of the engine's "
         f"tensor axis), got {parallel.rollout_tensor!r}")
  if parallel.rollout_devices and parallel.rollout_layout != "learner":
    fail("parallel.rollout_layout", "a rollout mesh apart (parallel.rollout_devices > 0) is "
         "data parallel over its own devices; the layout chooses among the learner's devices: "
         "keep rollout_layout = 'learner' with rollout_devices")


def _validate_off_policy(rl: ml_collections.ConfigDict) -> None:
  """Rollouts in flight (rl.max_staleness > 0) train on tokens drawn by weights up to k versions
  old. With one optimizer step a batch the old policy is the policy itself (ratio 1), so nothing
  weighs a stale token by its behaviour policy unless the config says how: truncated importance
  weights (rl.tis_cap > 0), the interpolated proximal policy (rl.proximal = loglinear), or
  rl.off_policy_correction = none to train them uncorrected on purpose."""
  corrected = rl.tis_cap > 0 or rl.proximal == "loglinear"
  if rl.max_staleness > 0 and rl.off_policy_correction == "required" and not corrected:
    fail("rl.max_staleness", f"{rl.max_staleness} trains tokens drawn by older weights with no "
         "correction for them: set rl.tis_cap > 0 (truncated importance sampling), "
         "rl.proximal='loglinear' (decoupled PPO), or rl.off_policy_correction='none' to train "
         "them uncorrected on purpose")


def check_decode_slots(config: ml_collections.ConfigDict, batch_shards: int) -> None:
  """The continuous engine's decode slots against the rollout mesh's data x fsdp =
  `batch_shards`."""
  rl = config.rl
  if rl.engine == "continuous" and rl.decode_slots % batch_shards:
    fail("rl.decode_slots", f"{rl.decode_slots} decode slots do not split over data x fsdp = "
         f"{batch_shards} devices (use a multiple of {batch_shards})")
  if rl.page_size and rl.kv_pages:
    own = pages.row_pages(rl.max_new_tokens, rl.page_size)
    least = batch_shards * (own + rl.decode_slots // batch_shards - 1)
    if rl.kv_pages % batch_shards or rl.kv_pages < least:
      fail("rl.kv_pages", f"{rl.kv_pages} pages: use a multiple of the {batch_shards} batch "
           f"shards, at least {least} (each shard holds one row of rl.max_new_tokens = "
           f"{rl.max_new_tokens} tokens in pages of {rl.page_size} and a page for each other "
           "slot, so that its longest row can always finish)")


def check_prefill_chunk(config: ml_collections.ConfigDict, prompt_len: int) -> None:
  """The prefill chunk against the prompt buffer of `prompt_len` tokens (known once the data
  is built)."""
  if config.rl.prefill_chunk > prompt_len:
    fail("rl.prefill_chunk", f"{config.rl.prefill_chunk} is longer than the prompt buffer "
         f"({prompt_len} tokens); use at most {prompt_len}, or 0 for the whole prompt")


def split_devices(config: ml_collections.ConfigDict, devices: Sequence,
                  process_count: int = 1) -> tuple[list, list]:
  """(learner devices, rollout devices) of `devices` (every process's, in `jax.devices()`
  order): each process gives its last `parallel.rollout_devices / process_count` devices to
  the rollout mesh; with rollout_devices = 0 the learner's devices sample too (the same list
  twice).

  Raises:
    ConfigError: the split leaves the learner no device, or does not divide over processes.
  """
  wanted = config.parallel.rollout_devices
  devices = list(devices)
  if wanted == 0:
    return devices, devices
  if wanted >= len(devices) or wanted % process_count:
    fail("parallel.rollout_devices", f"{wanted} rollout devices of {len(devices)} (over "
         f"{process_count} processes) must leave the learner at least one device on every "
         f"process and divide over the processes")
  per_process = wanted // process_count
  by_process = {}
  for device in devices:
    by_process.setdefault(device.process_index, []).append(device)
  if any(len(mine) <= per_process for mine in by_process.values()):
    fail("parallel.rollout_devices", f"{per_process} rollout devices a process leave a "
         f"process with no learner device")
  learner = [d for mine in by_process.values() for d in mine[:len(mine) - per_process]]
  rollout = [d for mine in by_process.values() for d in mine[len(mine) - per_process:]]
  return learner, rollout


def _validate_episode_fields(config: ml_collections.ConfigDict) -> None:
  """The bounds of multi-turn episodes and the horizon curriculum (read only when the task is an
  environment: `validate_episodes`)."""
  rl, c = config.rl, config.curriculum
  if not _whole(rl.max_turns, 1):
    fail("rl.max_turns", f"must be a whole number >= 1 (turns of the policy an episode may "
         f"take), got {rl.max_turns!r}")
  if not _whole(rl.turn_tokens, 0) or rl.turn_tokens > rl.max_new_tokens:
    fail("rl.turn_tokens", f"must be a whole number in [0, rl.max_new_tokens = "
         f"{rl.max_new_tokens}] (0 = rl.max_new_tokens), got {rl.turn_tokens!r}")
  if not _whole(rl.observation_tokens, 1):
    fail("rl.observation_tokens", f"must be a whole number >= 1, got {rl.observation_tokens!r}")
  if rl.credit not in CREDITS:
    fail("rl.credit", f"must be one of {CREDITS}, got {rl.credit!r}")
  if not 0 <= rl.turn_discount <= 1:
    fail("rl.turn_discount", f"must lie in [0, 1], got {rl.turn_discount!r}")
  if rl.credit == "turn":
    if rl.algorithm == "ppo":
      fail("rl.credit", "PPO gives each token its own credit (GAE over each turn's reward); "
           "credit='turn' is for the group estimators: use it with rloo, grpo, dr_grpo, "
           "reinforce_pp or counterfactual")
    if rl.whiten_rewards or rl.kl_reward_coef:
      fail("rl.credit", "credit='turn' reads each turn's own reward: switch off "
           "rl.whiten_rewards and rl.kl_reward_coef (they shape whole returns)")
  if c.horizon not in horizon_lib.HORIZONS:
    fail("curriculum.horizon", f"must be one of {horizon_lib.HORIZONS}, got {c.horizon!r}")
  if not _whole(c.horizon_start, 1) or c.horizon_start > rl.max_turns:
    fail("curriculum.horizon_start", f"must be a whole number in [1, rl.max_turns = "
         f"{rl.max_turns}], got {c.horizon_start!r}")
  if not c.horizon_temperature > 0:
    fail("curriculum.horizon_temperature", f"must be > 0, got {c.horizon_temperature!r}")
  if not 0 < c.horizon_alpha <= 1:
    fail("curriculum.horizon_alpha", f"must lie in (0, 1], got {c.horizon_alpha!r}")


def validate_episodes(config: ml_collections.ConfigDict, width: int) -> None:
  """What a run whose episodes take at most `width` turns (`turn_width`) needs: with more than
  one, its rows come back to the continuous engine after each turn, on a paged cache whose pool
  this run sizes, on the learner's devices, in one process; with one, a turn's own token limit
  (rl.turn_tokens) only on the continuous engine."""
  rl = config.rl
  if width == 1:
    if rl.turn_tokens and rl.turn_tokens < rl.max_new_tokens and rl.engine != "continuous":
      fail("rl.turn_tokens", "a turn's own token limit is the continuous engine's: set "
           "rl.engine='continuous' or rl.turn_tokens = 0")
    return
  if rl.engine != "continuous" or not rl.page_size:
    fail("rl.engine", "an environment's episodes run on the continuous engine over a paged KV "
         "cache (a row keeps its pages between turns): set rl.engine='continuous' and "
         "rl.page_size > 0")
  if rl.kv_pages:
    fail("rl.kv_pages", "episodes size their page pool themselves (every row's "
         "rl.max_new_tokens positions): leave rl.kv_pages = 0")
  if config.parallel.rollout_devices:
    fail("parallel.rollout_devices", "episodes decode on the learner's devices: set "
         "parallel.rollout_devices = 0")
  if rl.admission != "wait":
    fail("rl.admission", "episodes in flight wait for their last turn: set rl.admission="
         "'wait' (dropping a late group would drop episodes that are half played)")
  if rl.observation_tokens >= rl.max_new_tokens:
    fail("rl.observation_tokens", f"an observation ({rl.observation_tokens} ids) must leave "
         f"room for turns in an episode of rl.max_new_tokens = {rl.max_new_tokens} positions")
  if config.parallel.num_processes > 1:
    fail("parallel.num_processes", "episodes step their environments in one process: run a "
         "task that is an environment with one process")
