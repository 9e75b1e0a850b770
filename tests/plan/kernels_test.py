"""TPU attention kernels counted by their shapes (rl_curriculum/plan/kernels.py) in the roofline,
and the physical limits the planner prints beside its bounds (rl_curriculum/plan/report.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl_curriculum.model import blockwise_attention
from rl_curriculum.model import paged_attention
from rl_curriculum.plan import kernels, report, roofline, targets


@pytest.fixture(scope="module")
def one_v5e():
  return Mesh(np.array(targets.devices(targets.parse("v5e-4"))[:1]), ("x",))


def _spec(mesh, shape, dtype=jnp.bfloat16):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))


def _brute_block_pairs(t, s, bq, bk):
  """Pairs of the blocks holding a visible (query, key) pair, from the element mask."""
  visible = np.arange(s)[None, :] <= (s - t + np.arange(t))[:, None]            # [t, s]
  total = 0
  for i in range(0, t, bq):
    for j in range(0, s, bk):
      block = visible[i:i + bq, j:j + bk]
      total += block.size if block.any() else 0
  return total


@pytest.mark.parametrize("t,s,bq,bk", [(512, 512, 128, 128), (256, 512, 128, 128),
                                       (384, 1024, 128, 256), (1, 64, 1, 16), (100, 300, 32, 64)])
def test_causal_block_pairs_equal_the_blocks_of_the_mask(t, s, bq, bk):
  assert kernels.causal_block_pairs(t, s, bq, bk) == _brute_block_pairs(t, s, bq, bk)


def test_unknown_custom_calls_are_not_kernels():
  assert kernels.cost("AllocateBuffer.3", [], []) is None
  assert [kernels.kind_of(n) for n in ("ragged_paged_attention_kernel.1",
                                       "splash_mha_fwd_segmented_residuals.6",
                                       "splash_mha_dq_segmented_no_residuals.9",
                                       "splash_mha_dkv_segmented_no_residuals.9")] == [
      "ragged_paged_attention", "fwd", "dq", "dkv"]


def test_splash_forward_and_backward_count_their_attention(one_v5e):
  """Causal splash attention's gradient compiled for a v5e, rows through a loop: the program's
  FLOPs are its kernels' alone (the wrapper has no matmul), 4 + 6 + 8 = 18 H d per visited
  query-key pair a row (fwd, dq, dkv), every row counted; no kernel is left uncounted. The
  kernels move at least q, k, v, the output, their gradients once."""
  b, t, s, hkv, g, d = 2, 256, 512, 2, 2, 128
  args = (_spec(one_v5e, (b, t, hkv, g, d)), _spec(one_v5e, (b, s, hkv, d)),
          _spec(one_v5e, (b, s, hkv, d)), _spec(one_v5e, (b, s), jnp.bool_))

  def loss(q, k, v, m):
    out = blockwise_attention.attend(q, k, v, m, s - t, dtype=jnp.bfloat16, backend="splash",
                                     block=128)
    return out.astype(jnp.float32).sum()

  blockwise_attention.splash_kernel(t, s, s - t, hkv * g)   # its mask tables, outside set_mesh
  with jax.set_mesh(one_v5e):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile().as_text()
  cost = roofline.program_cost(text)
  pairs = _brute_block_pairs(t, s, 128, 128)
  assert cost.unknown_kernels == 0
  assert cost.flops == 18 * b * hkv * g * d * pairs
  q_bytes, kv_bytes = b * t * hkv * g * d * 2, b * s * hkv * d * 2
  assert cost.bytes >= 2 * (2 * q_bytes + 2 * kv_bytes)


@pytest.mark.parametrize("kv_tokens", [None, 24.5])
def test_paged_decode_counts_each_slots_keys(one_v5e, kv_tokens):
  """JAX's ragged paged attention decoding 8 slots for a v5e: 4 S H d K FLOPs, K the keys a slot
  attends over (the mean the planner gives, or its page table's width), and at least each
  slot's K keys and values of every KV head read."""
  seqs, kv_heads, group, head_dim, page_size, per_seq = 8, 2, 2, 128, 16, 4
  args = (_spec(one_v5e, (seqs, kv_heads, group, head_dim)),
          _spec(one_v5e, (seqs * per_seq, page_size, 2 * kv_heads, head_dim)),
          _spec(one_v5e, (seqs,), jnp.int32), _spec(one_v5e, (seqs, per_seq), jnp.int32))
  fn = functools.partial(paged_attention.decode_attention, backend="tpu", dtype=jnp.bfloat16,
                         num_kv_pages_per_block=2, num_queries_per_block=8)
  with jax.set_mesh(one_v5e):
    text = jax.jit(fn).lower(*args).compile().as_text()
  cost = roofline.program_cost(text, kv_tokens=kv_tokens)
  keys = kv_tokens or per_seq * page_size
  assert cost.unknown_kernels == 0
  assert cost.flops == 4 * seqs * kv_heads * group * head_dim * keys
  assert cost.bytes >= seqs * keys * 2 * kv_heads * head_dim * 2


def _plan(chip="v5e", trips=64.0, programs=("select", "prefill", "decode", "learn"), **bounds):
  """A plan as `planner.plan` returns it, by hand: 2 chips, a 1M-parameter model of 2 layers."""
  rows = {name: {"peak_gib": 1.0, "bound_s": bounds.get(name, 1.0), "flops": 0.0, "bytes": 0.0,
                 "trips": trips} for name in programs}
  return {"chip": {"name": chip, "bf16_flops": 100e12, "hbm_bytes_per_s": 1e12},
          "devices": 2, "programs": rows,
          "model": {"matmul_params": 1_000_000, "layers": 2, "attention_width": 256,
                    "kv_width": 128, "itemsize": 2, "cache_itemsize": 2, "vocab": 1000,
                    "d_model": 100},
          "workload": {"prompts": 4, "group": 8, "rows": 32, "prompt_len": 16, "new_tokens": 8,
                       "trained_prompts": 4, "epochs": 1}}


def test_physical_limits_are_the_models_own_work_at_the_peaks():
  """Each limit by hand: the learn step's 6 N per token plus 12 L d_attn per causal pair, at
  2 x 100 TFLOP/s; prefill's weights read once (bytes dominate); decode's weights once per trip
  plus every new token's context; select none; the step their sum, its ratio the bound's."""
  plan = _plan()
  limits = report.physical(plan)
  pairs_per_prompt = 16 * 17 / 2 + 8 * (8 * 16 + 8 * 9 / 2)
  learn_flops = 6e6 * 4 * (16 + 8 * 8) + 12 * 2 * 256 * 4 * pairs_per_prompt
  assert report.model_flops(plan) == pytest.approx(learn_flops)
  assert limits["learn"] == pytest.approx(max(learn_flops / 100e12, 2 * 2e6 / 1e12) / 2)
  assert limits["prefill"] == pytest.approx(2e6 / 2 / 1e12)
  contexts = 32 * (8 * 16 + 8 * 9 / 2)
  decode_bytes = 64 * 2e6 + contexts * 2 * 2 * 128 * 2
  assert limits["decode"] == pytest.approx(decode_bytes / 2 / 1e12)
  assert limits["select"] == 0.0
  r = report.roofline(plan)
  assert r["step_limit_s"] == pytest.approx(sum(limits.values()))
  assert r["step_ratio"] == pytest.approx(4.0 / r["step_limit_s"])


def test_no_physical_limit_on_cpu_devices_or_without_a_program():
  plan = _plan()
  plan["chip"] = None
  assert report.physical(plan) == {}
  partial = report.roofline(_plan(programs=("prefill", "decode")))
  assert partial["step_limit_s"] is None and partial["step_ratio"] is None


def test_chips_are_known_by_their_device_kind():
  kind = lambda name: type("Device", (), {"device_kind": name})()
  assert targets.chip_of(kind("TPU v5 lite")).name == "v5e"
  assert targets.chip_of(kind("TPU v6 lite")).name == "v6e"
  assert targets.chip_of(kind("TPU v5")).name == "v5p"
  assert targets.chip_of(kind("cpu")) is None and targets.chip_of(object()) is None
  assert [targets.chip_of(d).name for d in (targets.devices(targets.parse("v5e-4"))[0],
                                            targets.devices(targets.parse("v6e-8"))[0])] == [
      "v5e", "v6e"]


def test_a_run_on_known_chips_logs_its_plans_bound(monkeypatch):
  """`loop.plan_bound` on this host's device taken for a v5e chip (its programs compiled by
  XLA:CPU, counted against a v5e's peaks): a positive bound, logged with the physical limit; off
  with eval.plan_bound, and on a device no chip table knows, None without compiling."""
  import types  # pylint: disable=import-outside-toplevel
  from configs import toy  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  config = toy.get_config()
  run = types.SimpleNamespace(pool=types.SimpleNamespace(tokens=np.zeros((4, 32), np.int32)))
  lines = []
  assert loop.plan_bound(config, run, lines.append) is None and not lines    # a CPU
  monkeypatch.setattr(loop.targets, "chip_of", lambda device: targets.CHIPS["v5e"])
  bound = loop.plan_bound(config, run, lines.append)
  assert bound > 0 and len(lines) == 1 and "physical limit" in lines[0], lines
  monkeypatch.setattr(loop.targets, "chip_of", lambda device: targets.CHIPS["v5e"])
  broken = types.SimpleNamespace(pool=types.SimpleNamespace(tokens=np.zeros((4, 0), np.int32)))
  config.rl.prefill_chunk = 16   # longer than a prompt of 0 tokens: the planner refuses it
  assert loop.plan_bound(config, broken, lines.append) is None
  assert len(lines) == 2 and "could not plan" in lines[1], lines
  config.eval.plan_bound = False
  assert loop.plan_bound(config, run, lines.append) is None and len(lines) == 2
