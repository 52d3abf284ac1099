"""A setup module that fails on one rank only: the rank named by ``CONFORMANCE_TEST_FAILING_RANK`` raises
before its process group forms, while its peers wait for it at the rendezvous."""

import json
import os
import sys

# A rank's argv is the worker's, whether it started fresh or was forked (conformance.ranks.forkserver).
if json.loads(sys.argv[1])["rank"] == int(os.environ["CONFORMANCE_TEST_FAILING_RANK"]):
    raise RuntimeError("this rank's setup failed on purpose")
