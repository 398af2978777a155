import sys

import runner

if getattr(runner, "KINETIC_RUNNER", None) is None:
    # Another package's `runner/__init__.py` replaced Kinetic's; this __main__ is ours.
    where = getattr(runner, "__file__", None) or "?"
    sys.exit(
        f"kinetic: the `runner` package at {where} is not Kinetic's job runner: another "
        "package of that name overwrote it (such as the unrelated `runner` project on the "
        "package index). Remove it (`pip uninstall runner`) and reinstall kinetic-aio."
    )

from runner._main import main

sys.exit(main())
