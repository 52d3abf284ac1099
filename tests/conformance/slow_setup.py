"""A setup module that takes far longer to import than any start-up timeout in the tests."""

import time

time.sleep(60)
