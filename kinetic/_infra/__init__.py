"""Cluster set-up: ``kinetic up`` / ``down`` / ``status`` / ``pool ...``.

Layers, as elsewhere in Kinetic:

* :mod:`kinetic._infra.plan` -- pure: which Kubernetes objects ``up`` wants, in which
  order, what to do given what exists, the record of what ``up`` created, and the
  order in which ``down`` removes exactly that.
* :mod:`kinetic._infra.gke_api` -- pure: the Container REST API's requests (clusters,
  node pools from the accelerator catalog, operations) and the reading of its answers.
* :mod:`kinetic._infra.kube`, :mod:`kinetic._infra.container`,
  :mod:`kinetic._infra.bucket` -- the IO edges (Kubernetes API, Container API, the
  Storage JSON API's bucket calls, all over Kinetic's one HTTP edge, :mod:`kinetic._http`),
  each call bounded by a timeout and its failures translated into Kinetic's exception
  tree.
* :mod:`kinetic._infra.iam`, :mod:`kinetic._infra.registry`,
  :mod:`kinetic._infra.identity` -- pure: Google REST calls as values, IAM policy
  edits, the Artifact Registry repository, the pods' Google service account and
  Workload Identity, the grants ``up`` wants and the record of what it made in Google
  Cloud; :mod:`kinetic._infra.google_rest` sends them (IAM, Artifact Registry,
  Resource Manager, bucket IAM).
* :mod:`kinetic._infra.ops` -- the orchestration the commands run;
  :mod:`kinetic._infra.cloud` -- its Google Cloud part.

``lws-crd.json`` is the LeaderWorkerSet CustomResourceDefinition ``up`` installs (the
testbed installs the same file).
"""
