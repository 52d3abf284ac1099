"""A setup module that holds one rank back: the rank named by ``CONFORMANCE_TEST_LATE_RANK`` sleeps
``CONFORMANCE_TEST_LATE_SECONDS`` before its process group forms, as a rank of a slower host would."""

import json
import os
import sys
import time

# A rank's argv is the worker's, whether it started fresh or was forked (conformance.ranks.forkserver).
if json.loads(sys.argv[1])["rank"] == int(os.environ["CONFORMANCE_TEST_LATE_RANK"]):
    time.sleep(float(os.environ["CONFORMANCE_TEST_LATE_SECONDS"]))
