"""``python -m runner.pool --storage gs://BUCKET --group GID``: a pool worker
(:func:`runner.pool.worker.main`); a coordinated pool's when the batch's token is in
its environment (:mod:`runner.pool.coordinator.worker`)."""

import os
import sys

from runner.pool.coordinator.wire import TOKEN_ENV
from runner.pool.worker import Worker, main

if os.environ.get(TOKEN_ENV):
    from runner.pool.coordinator.worker import coordinated_worker

    sys.exit(main(make=coordinated_worker))
sys.exit(main(make=Worker))
