"""rl_curriculum.parallel: the device mesh, logical-axis rules, shardings, multi-host start-up.

`mesh` holds the one table from logical axis names to mesh axes and builds every sharding;
`distributed` starts `jax.distributed` and moves data between hosts and global arrays.
"""

from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh
from rl_curriculum.parallel.mesh import (BATCH_AXES, LOGICAL_AXIS_RULES, MESH_AXES, axis_rules,
                                         batch_sharding, batch_shardings, kv_cache_shardings,
                                         logical_to_mesh, make_mesh, opt_state_shardings,
                                         param_shardings, replicated, tree_shardings)

__all__ = ["distributed", "mesh", "BATCH_AXES", "LOGICAL_AXIS_RULES", "MESH_AXES", "axis_rules",
           "batch_sharding", "batch_shardings", "kv_cache_shardings", "logical_to_mesh",
           "make_mesh", "opt_state_shardings", "param_shardings", "replicated",
           "tree_shardings"]
