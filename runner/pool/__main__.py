"""``python -m runner.pool --storage gs://BUCKET --group GID``: a pool worker
(:func:`runner.pool.worker.main`)."""

import sys

from runner.pool.worker import main

sys.exit(main())
