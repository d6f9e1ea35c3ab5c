"""`python -m caprecon`: the command line."""

import sys

from caprecon.cli import main

sys.exit(main())
