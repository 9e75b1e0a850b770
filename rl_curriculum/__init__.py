"""rl_curriculum: RL post-training of language models with automatic curricula, in JAX.

Subpackages: `model` (policy transformer, LoRA), `sampling` (KV-cache sampler), `rl` (advantages,
losses, stability), `curriculum` (SEC and relatives), `tasks` (verifiable problems), `parallel`
(meshes and shardings), `train` (the experiment loop). Shared pytrees live in `types`.
"""

__version__ = "0.1.0"


def _cpu_unless_an_accelerator_is_here() -> None:
  """With libtpu installed (the `tpu` extra, for planning) on a host with no TPU chip, JAX would
  start the TPU runtime, which fails, prints a page of warnings and falls back to the CPU. When
  no platform is named (JAX_PLATFORMS), no TPU chip is on the PCI bus or among the device files
  and no GPU plugin is installed, name the CPU instead. Compiling for a TPU slice (`plan.targets`) still works."""
  import glob  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):   # TPU chips' device files
    return
  google = "0x1ae0"   # the PCI vendor id of Google's TPU chips
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(vendor) as f:
        if f.read().strip() == google:
          return
    except OSError:
      return
  if any(importlib.util.find_spec(name) for name in ("jax_cuda12_plugin", "jax_cuda13_plugin",
                                                     "jax_rocm60_plugin", "jax_rocm7_plugin")):
    return
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")


_cpu_unless_an_accelerator_is_here()
