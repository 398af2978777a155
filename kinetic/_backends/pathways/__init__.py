"""The pathways backend: multi-host TPU jobs as LeaderWorkerSets (see :mod:`.backend`)."""
