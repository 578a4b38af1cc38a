"""The seeds a replay runs over, as the commands take them: "42-51" or "42,45", bounded."""

from __future__ import annotations

import argparse

#: The most seeds one command runs (each is a whole replay).
MAX_SEEDS = 1000


def parse_seeds(spec: str) -> list[int]:
    """ "42-51" → 42..51; "42,45" → [42, 45]. Raises argparse.ArgumentTypeError."""
    try:
        if "-" in spec.strip().lstrip("-") and "," not in spec:
            lo, hi = (int(x) for x in spec.split("-", 1))
            if hi < lo:
                raise ValueError
            if hi - lo >= MAX_SEEDS:  # counted before the list is built: "0-10000000000"
                raise argparse.ArgumentTypeError(f"{spec!r}: between 1 and {MAX_SEEDS} seeds")
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in spec.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected A-B (A <= B) or A,B,...") from None
    if not seeds or len(seeds) > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"{spec!r}: between 1 and {MAX_SEEDS} seeds")
    return seeds
