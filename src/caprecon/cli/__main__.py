"""`python -m caprecon.cli`: the command line."""

import sys

from caprecon.cli import main

sys.exit(main())
