"""``python -m client.cli``: the same as the ``ldp-client`` console script."""

import sys

from client.cli.main import main

sys.exit(main())
