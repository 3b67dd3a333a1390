"""``python -m flatgather``: the ``flatgather`` command (see :mod:`flatgather.cli`)."""

import sys

from flatgather.cli import main

if __name__ == "__main__":
    sys.exit(main())
