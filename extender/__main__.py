"""`python -m extender` is `mpsched`."""

import sys

from extender.cli import main

sys.exit(main())
