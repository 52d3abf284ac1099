"""``python -m conformance ...`` (and ``torchrun ... -m conformance run ...``): the ``conformance`` command."""

import sys

from conformance.cli import main

sys.exit(main())
