"""``python -m flatgather.sglang.spec_logprobs_check``: the running
release's host-copy fingerprint, for ``COPY_HELPERS``."""

import sys

from flatgather.sglang.spec_logprobs_check.consumers import main

if __name__ == "__main__":
    sys.exit(main())
