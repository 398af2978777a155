"""What runs inside a Kinetic job: fetch, verify, unpack, run, record.

This package is deliberately small and imports almost nothing at start-up
(``cloudpickle`` and the standard library), so a job on the local backend
starts as fast as a bare interpreter. It never imports ``kinetic``, except the
GCS store when the job's storage is a ``gs://`` bucket (:mod:`runner.store`): the
runner's GCS access is Kinetic's, on a private loop, rather than a second client.

Modules without a leading underscore (``protocol``, ``job``, ``fs``, ``store``,
``results_log``, ``walk``, ``contexts``, ``data``, ...) are the ones Kinetic's client
side shares; ``_main``, ``_member`` and ``_tee`` are the runner's own.
"""
