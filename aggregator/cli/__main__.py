"""``python -m aggregator.cli``: the same as the ``ldp-aggregator`` console script."""

import sys

from aggregator.cli import main

sys.exit(main())
