"""A worker of a GKE batch pool and what it knows of the batch: ``python -m runner.pool``.

The protocol as a whole (the objects in storage, the invariants, the failure model,
the limits and the cost) is told in ``docs/pool-protocol.md``; each module's docstring
tells its own part and points there. Nothing is imported here: the zygote
(:mod:`runner.pool.zygote`) and Kinetic's readers (:mod:`kinetic._core.pool_plan`)
import only the modules they need.
"""
