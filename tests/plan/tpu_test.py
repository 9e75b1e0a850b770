"""The planner on XLA:TPU (rl_curriculum/plan/): programs compiled for TPU slices on this CPU host
(libtpu from the `tpu` extra; no TPU needed), their costs with loops counted, out-of-memory as a
row, the learn step's FLOPs against 6 N per token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl_curriculum.plan import measure, planner, report, roofline, targets
import test_util

ROWS, D, LAYERS = 512, 1024, 6


@pytest.fixture(scope="module")
def v5e():
  return targets.devices(targets.parse("v5e-4"))


def _spec(mesh, shape, *axes):
  return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec(*axes)))


def _layer(h, w):
  return jnp.tanh(h @ w), None


def _scanned(x, ws):
  return jax.lax.scan(_layer, x, ws)[0].sum()


def _unrolled(x, ws):
  for i in range(ws.shape[0]):
    x = _layer(x, ws[i])[0]
  return x.sum()


def test_targets_name_the_slices_cloud_tpu_sells():
  assert [(t.chips, t.topology) for t in map(targets.parse, ("v5e-8", "v5p-8", "v6e-8",
                                                            "v5e-16", "v5p-32"))] == [
      (8, "v5e:2x4"), (4, "v5p:2x2x1"), (8, "v6e:2x4"), (16, "v5e:4x4"), (16, "v5p:2x2x4")]
  assert targets.parse("cpu:8").chips == 8 and not targets.parse("cpu:8").is_tpu
  for bad in ("v5e-3", "v5p-6", "v7-8", "tpu"):
    with pytest.raises(ValueError, match="--target"):
      targets.parse(bad)


def test_a_scanned_loop_counts_as_its_unrolled_twin(v5e):
  """XLA's own cost analysis counts a loop body once; the planner's count of six scanned layers
  equals that of the same six layers unrolled, and both equal 2 x rows x D^2 per layer and
  device (forward), 3x that with the backward pass but the input's gradient of the first layer,
  which only the scan computes."""
  mesh = Mesh(np.array(v5e), ("d",))
  x, ws = _spec(mesh, (ROWS, D), "d", None), _spec(mesh, (LAYERS, D, D))
  per_layer = 2 * (ROWS // len(v5e)) * D * D
  counted = {}
  for f in (_scanned, _unrolled):
    for grad in (False, True):
      compiled = jax.jit(jax.grad(f, argnums=1) if grad else f).lower(x, ws).compile()
      counted[f.__name__, grad] = (roofline.program_cost(compiled.as_text()),
                                   compiled.cost_analysis())
  assert counted["_scanned", False][0].flops == counted["_unrolled", False][0].flops
  assert counted["_scanned", False][0].flops == LAYERS * per_layer
  assert counted["_scanned", True][0].flops == 3 * LAYERS * per_layer
  assert counted["_unrolled", True][0].flops == (3 * LAYERS - 1) * per_layer
  xla_scanned = counted["_scanned", False][1]["flops"]
  assert xla_scanned < 1.1 * per_layer          # XLA: one layer's worth
  for grad in (False, True):                    # no loop: bytes as XLA counts them
    mine, xla = counted["_unrolled", grad][0].bytes, counted["_unrolled", grad][1]["bytes accessed"]
    assert 0.75 * xla <= mine <= 1.25 * xla, (grad, mine, xla)


def test_fsdp_windowed_matmuls_count_the_model_flops():
  """Under FSDP XLA:TPU splits a matmul into a loop of partial matmuls that steps its counter by
  two (a windowed matmul, fed by collective permutes): an MLP's forward on a v5e-8 counts
  exactly its model FLOPs, summed over the chips."""
  devices = targets.devices(targets.parse("v5e-8"))
  mesh = Mesh(np.array(devices), ("f",))
  b, t, d, f = 16, 1024, 2048, 11008
  x = _spec(mesh, (b, t, d), "f", None, None)
  w1, w2 = _spec(mesh, (d, f), "f", None), _spec(mesh, (f, d), "f", None)

  def mlp(x, w1, w2):
    h = jax.nn.gelu(jnp.einsum("btd,df->btf", x, w1))
    return jnp.einsum("btf,fd->btd", h, w2).astype(jnp.float32).sum()

  compiled = jax.jit(mlp).lower(x, w1, w2).compile()
  assert "windowed_dot_general" in compiled.as_text()
  counted = roofline.program_cost(compiled.as_text()).flops * len(devices)
  assert counted == 2 * 2 * b * t * d * f


def test_batched_matmuls_count_their_flops_once(v5e):
  """XLA:TPU writes a batched matmul as a convolution whose batch dimensions are a dilated
  window: attention's two einsums count 2 x 2 x b h t s d FLOPs, no more."""
  mesh = Mesh(np.array(v5e[:1]), ("d",))
  b, h, t, d = 4, 8, 256, 64
  q = _spec(mesh, (b, h, t, d))

  def attention(q, k, v):
    s = jnp.einsum("bhtd,bhsd->bhts", q, k).astype(jnp.float32)
    return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s).astype(q.dtype), v).sum()

  compiled = jax.jit(attention).lower(q, q, q).compile()
  assert roofline.program_cost(compiled.as_text()).flops == 2 * 2 * b * h * t * t * d


def test_in_place_updates_count_their_update_not_the_buffer(v5e):
  """A loop of 64 steps writing two rows into a donated 64 MiB buffer by a scatter (a paged
  cache's write) moves a few rows' bytes a step (the update, the rows it is gathered from, the
  indices), not the buffer (counted whole, read and written, it was 128 x the buffer)."""
  mesh = Mesh(np.array(v5e[:1]), ("d",))
  pages, row = 4096, 8192
  pool = _spec(mesh, (pages, row))
  new = _spec(mesh, (64, row))

  def write(pool, new):
    def step(i, pool):
      page = (i * 61) % pages
      return pool.at[jnp.stack([page, page + 1])].set(new[jnp.stack([i, i])])
    return jax.lax.fori_loop(0, 64, step, pool)

  compiled = jax.jit(write, donate_argnums=0).lower(pool, new).compile()
  counted = roofline.program_cost(compiled.as_text()).bytes
  row_bytes = row * 2
  assert 64 * 2 * row_bytes <= counted <= 64 * 16 * row_bytes, counted


def test_an_out_of_memory_compile_is_a_row(v5e):
  mesh = Mesh(np.array(v5e[:1]), ("d",))
  big = jax.ShapeDtypeStruct((1024, 1024, 1024), jnp.float32,
                             sharding=NamedSharding(mesh, PartitionSpec()))

  def forty_copies(x):
    ys = jax.lax.optimization_barrier([x * i for i in range(40)])
    return sum(y.sum() for y in ys)

  row, compiled = measure.measure(lambda: jax.jit(forty_copies).lower(big))
  assert compiled is None
  assert row["error"] == "needs 160.00 GiB of temporaries, the chip has 15.75"
  assert not report.fits(row, 15.75)


_small = test_util.small_plan_config


@pytest.mark.slow
def test_learn_flops_are_about_6n_per_token_and_remat_adds_a_forward_pass():
  """At a small config trained on-policy (one forward and backward pass, no reference, no
  rollback pass), the learn step's FLOPs counted by XLA:TPU are 1.0-1.5 times the model's (6 N
  per token plus attention, each prompt once per group); block rematerialisation adds one
  forward pass (2 N per token: +0.25-0.45 of that), a second minibatch the old policy's
  forward pass (+0.25-0.55)."""
  ratio = {}
  for name, overrides in (("one_pass", {}), ("remat", {"model__remat": "block"}),
                          ("two_minibatches", {"rl__minibatches": 2})):
    plan = planner.plan(_small(**overrides), target="v5e-4", prompt_len=32,
                        programs=("learn",))
    assert plan["fits"] and plan["programs"]["learn"]["unknown_loops"] == 0
    ratio[name] = plan["roofline"]["learn_flops_ratio"]
  assert 1.0 <= ratio["one_pass"] <= 1.5, ratio
  assert 0.25 <= ratio["remat"] - ratio["one_pass"] <= 0.45, ratio
  assert 0.25 <= ratio["two_minibatches"] - ratio["one_pass"] <= 0.55, ratio


@pytest.mark.parametrize("group", [8, 16])
def test_learn_memory_falls_as_microbatches_split_the_groups(group):
  """Four prompts of G completions (XLA:CPU on this process's device: the tiny model's
  temporaries are too small for XLA:TPU to keep in HBM): at eight microbatches each group's
  rows are split over two of them (`forward.block_group`), and the learn step's temporaries keep
  falling as microbatches rise."""
  temps = []
  for microbatches in (1, 2, 4, 8):
    c = _small(rl__prompts_per_step=4, rl__group_size=group, rl__max_new_tokens=64,
               rl__microbatches=microbatches)
    plan = planner.plan(c, hbm_gib=1.0, prompt_len=32, programs=("learn",))
    temps.append(plan["programs"]["learn"]["temp_gib"])
  assert all(b < a for a, b in zip(temps, temps[1:])), temps


@pytest.mark.slow
def test_the_engine_on_a_copy_of_its_own_reads_no_gathered_weights():
  """Learner FSDP over a v5e-4, the continuous engine: decoding the learner's layout, each decode
  iteration gathers the weights again (the bytes it moves are several times what it must read);
  on a whole copy made once by the reshard program (`rollout_layout=replicated`) they move less
  than a third as many bytes per byte they must read (that copy and the KV cache; under 2x here,
  where the suite compiles at optimisation level 0 and the tiny model's weights are 3 MB), the
  iteration's bound falls by half, and the reshard is one more program of the step."""
  plans = {}
  for layout in ("learner", "replicated"):
    c = _small(rl__engine="continuous", rl__decode_slots=16)
    c.parallel.rollout_layout = layout
    plans[layout] = planner.plan(c, target="v5e-4", prompt_len=32, programs=("sampler",))
  learner, copy = plans["learner"], plans["replicated"]
  assert learner["rollout_mesh"] is None and "reshard" not in learner["programs"]
  assert copy["rollout_mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert list(copy["programs"]) == ["reshard", "prefill", "decode"]
  assert copy["fits"] and copy["programs"]["reshard"]["bound_s"] > 0
  assert copy["engine_policy_gib"] == pytest.approx(learner["policy_gib"] * 4)  # whole, float32
  ratio = lambda p: p["roofline"]["decode_bytes_ratio"]
  assert ratio(learner) > 3 * ratio(copy), (ratio(learner), ratio(copy))
  assert ratio(copy) < 2
  per_trip = lambda p: p["programs"]["decode"]["bound_s"] / p["programs"]["decode"]["trips"]
  assert per_trip(copy) < per_trip(learner) / 2


@pytest.mark.slow
def test_the_command_plans_the_quickstart_for_a_v5e_as_it_is(tmp_path):
  """`python -m experiments.plan --target v5e-4` on configs/quickstart.py, whose model is a named
  checkpoint (its shape from the preset, no weights): every program compiled by XLA:TPU, with a
  roofline bound, and exit status 0 (it fits); an unknown target is a usage error."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = tmp_path / "plan.json"
  run = lambda *args: subprocess.run([sys.executable, "-m", "experiments.plan", *args],
                                     cwd=root, capture_output=True, text=True, timeout=600,
                                     env={**os.environ, "PYTHONPATH": root})
  result = run("--config", "configs/quickstart.py", "--target", "v5e-4", "--out", str(out))
  assert result.returncode == 0, result.stderr[-3000:]
  plan = json.loads(out.read_text())
  assert plan["chip"]["name"] == "v5e" and plan["devices"] == 4 and plan["fits"]
  assert list(plan["programs"]) == ["select", "prefill", "decode", "learn"]
  assert all(p["bound_s"] > 0 for name, p in plan["programs"].items() if name != "select")
  assert plan["programs"]["learn"]["peak_gib"] < 15.75
  assert plan["roofline"]["step_s"] > 0 and plan["roofline"]["learned_tokens_per_s_per_chip"] > 0
  assert "by XLA:TPU" in result.stdout and result.stdout.strip().endswith("FITS")
  assert plan["roofline"]["step_ratio"] >= 1 and "physical limit" in result.stdout
  bad = run("--config", "configs/quickstart.py", "--target", "v5e-3")
  assert bad.returncode != 0 and "--target 'v5e-3'" in bad.stderr


def test_with_the_tpu_compiler_installed_a_host_without_a_tpu_runs_quietly_on_the_cpu():
  """libtpu is installed (this suite compiles for TPU slices); importing the package on a host
  with no TPU chip names the CPU, so JAX neither starts the TPU runtime nor prints its warnings."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  assert importlib.util.find_spec("libtpu") is not None
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  result = subprocess.run([sys.executable, "-c", "import rl_curriculum, jax; "
                           "print(jax.default_backend(), jax.device_count())"],
                          capture_output=True, text=True, timeout=120, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["cpu", "1"]
  assert "TPU" not in result.stderr, result.stderr[-2000:]


def test_a_padded_window_that_meets_one_input_element_counts_one_tap():
  """A projection XLA:TPU wrote as a convolution (from a remat's backward pass on a v5e-8): the
  16 heads are a window of 16 over one input element padded by 15 on each side, so each output
  meets one tap; counted as 16 (the window), the learn step's FLOPs came out twice the model's."""
  hlo = """HloModule m

ENTRY %main (a: bf16[2,1024,2048,1], b: bf16[2048,16,128,1]) -> bf16[2,1024,16,128] {
  %a = bf16[2,1024,2048,1]{2,1,3,0} parameter(0)
  %b = bf16[2048,16,128,1]{0,2,1,3} parameter(1)
  ROOT %convolution.354 = bf16[2,1024,16,128]{1,3,2,0} convolution(%a, %b), window={size=1x16 pad=0_0x15_15 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}
"""
  assert roofline.program_cost(hlo).flops == 2 * (2 * 1024 * 16 * 128) * 2048
  strided = hlo.replace("pad=0_0x15_15", "pad=0_0x0_0").replace(
      "b: bf16[2048,16,128,1]", "b: bf16[2048,16,128,1]").replace(
      "a: bf16[2,1024,2048,1]", "a: bf16[2,1024,2048,16]").replace(
      "%a = bf16[2,1024,2048,1]", "%a = bf16[2,1024,2048,16]").replace(
      "bf16[2,1024,16,128]{1,3,2,0} convolution", "bf16[2,1024,1,128]{1,3,2,0} convolution")
  assert roofline.program_cost(strided).flops == 2 * (2 * 1024 * 1 * 128) * 2048 * 16
