"""numpy, imported at its first use rather than with the mechanisms.

A device builds its mechanisms from a survey definition and sends one answer through
``Mechanism.randomize_payload``, which is pure Python: it never needs numpy, and numpy is about
20 MB of a device's peak memory (docs/performance.md, "Device footprint"). The bulk paths
(``simulate``, ``decode_many``, the channel, the aggregator's statistics) read ``np.<name>`` as
before; the first such read imports numpy and copies its names onto the proxy, so later reads
are plain attribute reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["np"]


class _LazyNumpy:
    """Stands for the numpy module until its first attribute read."""

    def __getattr__(self, name: str) -> object:
        import numpy

        self.__dict__.update(vars(numpy))
        return getattr(numpy, name)


if TYPE_CHECKING:
    import numpy as np
else:
    np = _LazyNumpy()
