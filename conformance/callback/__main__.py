"""``python -m conformance.callback``: the same as ``conformance callback``."""

import sys

from conformance.callback.command import main

sys.exit(main())
