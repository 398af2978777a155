"""The GKE backend (IO edge): Kubernetes Jobs, shared watches, GCS storage.

Imported lazily (only when a job uses ``backend="gke"``): its Kubernetes client
(aiohttp, the kubeconfig rules) is not loaded by ``import kinetic``.
"""
