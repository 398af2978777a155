"""What runs inside a Kinetic job: fetch, verify, unpack, run, record.

This package is deliberately small and imports almost nothing at start-up
(``cloudpickle`` and the standard library), so a job on the local backend
starts as fast as a bare interpreter. It never imports ``kinetic``, except the
GCS store when the job's storage is a ``gs://`` bucket.
"""
