"""`python -m ragen2` (also what `accelerate launch -m ragen2` runs)."""

import sys

from ragen2.cli import main

sys.exit(main())
