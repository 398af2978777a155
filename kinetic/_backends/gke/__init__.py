"""The GKE backend (IO edge): Kubernetes Jobs, shared watches, GCS storage.

Imported lazily (only when a job uses ``backend="gke"``): kubernetes-asyncio is
not loaded by ``import kinetic``.
"""
