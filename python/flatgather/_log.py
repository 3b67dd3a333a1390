"""flatgather's log: one logger, ``flatgather``, on stderr.

The switch arms flatgather while Python starts and logs while SGLang is
still importing, before anything configures logging, so the logger carries
its own handler. Standard library only: this runs at interpreter start-up.
"""

import logging
import os
import sys

LOG_ENV = "FLATGATHER_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def logger() -> logging.Logger:
    """flatgather's logger, writing to stderr at ``FLATGATHER_LOG_LEVEL``.
    An unknown level is reported and INFO is used: a typo must not stop a
    server from starting."""
    log = logging.getLogger("flatgather")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[flatgather] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        wanted = os.environ.get(LOG_ENV, "INFO").strip().upper() or "INFO"
        if wanted not in LEVELS:
            log.setLevel(logging.INFO)
            log.warning(
                "%s=%s is not a log level (%s); using INFO",
                LOG_ENV,
                os.environ.get(LOG_ENV),
                ", ".join(LEVELS),
            )
        else:
            log.setLevel(wanted)
    return log
