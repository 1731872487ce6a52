"""`python -m podium ...` runs the podium command line (same as the `podium` script)."""

import sys

from podium._src.cli import main

sys.exit(main())
