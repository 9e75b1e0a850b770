"""The machines a plan is for: TPU slices compiled for on any host, or N (fake) CPU devices.

  target = targets.parse("v5e-8")      # Target(chip=CHIPS["v5e"], chips=8, topology="v5e:2x4")
  devices = targets.devices(target)    # the slice's 8 devices, from libtpu; no TPU needed

A TPU target is named as Google Cloud names its slices: `v5e-N` and `v6e-N` count chips, `v5p-N`
counts TensorCores (two a chip, so a v5p-8 is 4 chips). Its devices come from
`jax.experimental.topologies.get_topology_desc`, which needs libtpu installed (the `tpu` extra)
but no TPU: programs lowered over them are compiled by XLA:TPU on the CPU host. A slice larger
than one host (a v5e-16 is 4 hosts of 4 chips) gives every host's devices; the plan is per chip.
`cpu:N` plans on N CPU devices (`--xla_force_host_platform_device_count`, set before JAX starts).
"""

import dataclasses
import os
import re
from typing import Optional

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's peaks, as its maker publishes them."""
  name: str
  bf16_flops: float      # dense bfloat16 FLOP/s
  hbm_bytes_per_s: float  # HBM bandwidth, bytes/s
  hbm_gib: float         # HBM that XLA:TPU lets a program use (its out-of-memory message's figure)
  cores_per_chip: int    # TensorCores a chip counts for in a slice's name
  source: str


# Peaks from Google Cloud's TPU pages (system architecture, per chip). hbm_gib is the capacity
# XLA:TPU reports when a program does not fit ("exceeds available HBM (15.75G)"), below the
# nominal 16 / 95 / 32 GB.
CHIPS = {
    "v5e": Chip("v5e", bf16_flops=197e12, hbm_bytes_per_s=819e9, hbm_gib=15.75,
                cores_per_chip=1, source="https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("v5p", bf16_flops=459e12, hbm_bytes_per_s=2765e9, hbm_gib=95.74,
                cores_per_chip=2, source="https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("v6e", bf16_flops=918e12, hbm_bytes_per_s=1640e9, hbm_gib=31.25,
                cores_per_chip=1, source="https://cloud.google.com/tpu/docs/v6e"),
}

# What JAX's TPU devices call each chip (`device.device_kind`).
_DEVICE_KINDS = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v6 lite": "v6e", "TPU v6e": "v6e",
                 "TPU v5": "v5p", "TPU v5p": "v5p"}


def chip_of(device) -> Optional[Chip]:
  """The chip a JAX device is (by its device_kind), or None for any other device."""
  name = _DEVICE_KINDS.get(getattr(device, "device_kind", ""))
  return CHIPS[name] if name else None


# Chip grids of the slice sizes a plan names (libtpu's topology names).
_V5E_V6E_GRIDS = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
                  256: "16x16"}
_V5P_GRIDS = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8"}


@dataclasses.dataclass(frozen=True)
class Target:
  """What a plan compiles for: `chips` devices of `chip` (None: CPU devices)."""
  name: str
  chips: int
  chip: Optional[Chip] = None
  topology: Optional[str] = None   # libtpu's topology name, e.g. "v5e:2x4"

  @property
  def is_tpu(self) -> bool:
    return self.chip is not None


def parse(name: str) -> Target:
  """`v5e-8`, `v5p-8`, `v6e-8`, `v5e-16`, `v5p-32`, ... or `cpu:N`.

  Raises:
    ValueError: an unknown chip, or a slice size without a known chip grid.
  """
  m = re.fullmatch(r"cpu:(\d+)", name)
  if m:
    return Target(name=name, chips=int(m.group(1)))
  m = re.fullmatch(r"(v5e|v5p|v6e)-(\d+)", name)
  if not m:
    raise ValueError(f"--target {name!r}: expected cpu:N or a TPU slice such as "
                     f"{', '.join(f'{c}-8' for c in CHIPS)}, v5e-16 or v5p-32")
  chip = CHIPS[m.group(1)]
  size = int(m.group(2))
  if size % chip.cores_per_chip:
    raise ValueError(f"--target {name!r}: a {chip.name} slice counts {chip.cores_per_chip} "
                     "cores a chip")
  chips = size // chip.cores_per_chip
  grids = _V5P_GRIDS if chip.name == "v5p" else _V5E_V6E_GRIDS
  if chips not in grids:
    raise ValueError(f"--target {name!r}: {chips} {chip.name} chips; known slices have "
                     f"{', '.join(str(n * chip.cores_per_chip) for n in grids)}")
  return Target(name=name, chips=chips, chip=chip, topology=f"{chip.name}:{grids[chips]}")


def devices(target: Target) -> list:
  """The target's devices: the TPU slice's from libtpu's topology (compile-only devices, on any
  host), or the first `chips` CPU devices JAX sees.

  Raises:
    RuntimeError: a TPU target without libtpu installed, or fewer CPU devices than asked for.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if not target.is_tpu:
    found = jax.devices("cpu")
    if len(found) < target.chips:
      raise RuntimeError(f"{target.name}: JAX sees {len(found)} CPU devices; set XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={target.chips} before JAX "
                         "starts (python -m experiments.plan does)")
    return found[:target.chips]
  # Compiling loads libtpu, which by default lets one process at a time hold it (a lockfile
  # meant for processes that run on the chips); compiling runs nothing on a chip, so several
  # processes (test workers, a plan beside a run) may each load it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    topology = topologies.get_topology_desc(platform="tpu", topology_name=target.topology)
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(f"{target.name}: no TPU compiler ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200]}); install it with "
                       "pip install -e '.[tpu]'") from e
  return list(topology.devices)
