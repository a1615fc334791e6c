"""CPU work off the event loop: planning, translation and result building run in a worker pool.

The event loop only moves bytes; a statement whose planning takes seconds must not hold up
another analyst's ``SELECT 1``. Work goes to a small, bounded pool of threads: numpy releases
the GIL in its heavy loops, and a short switch interval makes pure-Python work (sqlglot, the
engine's bookkeeping) hand the GIL back to the loop within a millisecond.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

__all__ = ["Workers", "SWITCH_INTERVAL"]

T = TypeVar("T")

#: How long a thread may hold the GIL while another wants it (Python's default is 5 ms).
SWITCH_INTERVAL: Final = 0.001


class Workers:
    """A bounded pool of threads for CPU-bound work of one server.

    Args:
        threads: how many statements may compute at once; more wait their turn.
    """

    def __init__(self, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError("a worker pool needs at least one thread")
        # the loop must get the GIL back promptly from workers running Python code
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dpproxy-worker")

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Start ``fn`` in a worker; the future completes on the running loop."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a worker and wait for its result."""
        return await self.submit(fn)

    def close(self) -> None:
        """Stop taking work; running work finishes in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
