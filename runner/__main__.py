import sys

from runner._main import main

sys.exit(main())
