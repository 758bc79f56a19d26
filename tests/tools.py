"""Environment tools shared by the episode tests and bench/latency.py."""

from __future__ import annotations

import time


class Sleeper:
    """A tool that sleeps: a turn that asks for long naps runs out of its tool time."""

    def reset(self, **row) -> None:
        pass

    def nap(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "rested"
