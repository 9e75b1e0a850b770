"""Will a config fit? The run's programs compiled ahead of time from abstract shapes.

  planner  every program of a run compiled for the devices JAX sees, memory per device
  abstract the programs' abstract inputs (shapes and shardings, no values)
"""
