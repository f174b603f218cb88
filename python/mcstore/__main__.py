"""python -m mcstore: see mcstore.cli."""

import sys

from mcstore.cli import main

sys.exit(main())
