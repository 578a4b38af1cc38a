"""The extender benchmark's entry point: `python scripts/bench_extender.py --help`, or
scripts/bench-extender, which runs serve and the floor on the compiled build. What the bench
measures and how is the documentation of its package, scripts/extender_bench/, which holds the
code.

The bench re-launches this script by its path to run its floor (`--floor-server PORT`) and its
API servers (`--api-server PORT --api-dump FILE`). Run as a script, its folder is first on
sys.path, so the package beside it is the one imported.
"""

from __future__ import annotations

import sys

from extender_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
