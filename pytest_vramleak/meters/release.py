"""The release scheduler: between tests, hand cached accelerator memory back when it runs high.

The caching allocator keeps freed blocks reserved for reuse. Over a long suite the reserved pool
grows with the largest tests and fragments, and a later test that needs one big block can fail
with an out-of-memory error although little is allocated. Between tests, when a device's reserved
memory passes a share of its capacity, the scheduler collects garbage and empties the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..tracking import gc_functions as gc


class PercentError(ValueError):
    """A share of memory that is not a percentage between 0 and 100."""


def parse_percent(value: object) -> float:
    """``"80%"`` or ``"80"`` as the fraction 0.8; above 0 and at most 100 percent."""
    text = str(value).strip()
    number = text[:-1].strip() if text.endswith("%") else text
    try:
        percent = float(number)
    except ValueError:
        raise PercentError(f"expected a percentage such as '80%', got {value!r}") from None
    if not 0 < percent <= 100:
        raise PercentError(f"expected a percentage above 0% and at most 100%, got {value!r}")
    return percent / 100


@dataclass
class ReleaseScheduler:
    """Empties the caching allocator of every initialised device whose reserved memory is over ``fraction``."""

    backend: Any
    """``torch.cuda``, or a fake with the same functions in unit tests."""
    fraction: float
    releases: int = 0
    released_bytes: int = 0

    def between_tests(self) -> int:
        """Release where needed; return the bytes handed back to the driver."""
        if not self.backend.is_initialized():
            return 0  # asking about a device would create its context
        over = [
            index
            for index in range(self.backend.device_count())
            if self.backend.memory_reserved(index)
            > self.fraction * self.backend.get_device_properties(index).total_memory
        ]
        if not over:
            return 0
        before = sum(self.backend.memory_reserved(index) for index in over)
        gc.collect()
        self.backend.empty_cache()
        released = int(max(0, before - sum(self.backend.memory_reserved(index) for index in over)))
        self.releases += 1
        self.released_bytes += released
        return released
