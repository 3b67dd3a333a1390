"""``python -m flatgather.launch_server ARGS``: SGLang's server with flatgather on.

Sets ``FLATGATHER_SGLANG=1`` (keeping ``force`` if already set) for this
process and every process it starts, then runs ``sglang.launch_server`` with
exactly the same arguments.
"""

from __future__ import annotations

import os
import runpy
import sys

ENTRY = "sglang.launch_server"

HELP = """usage: python -m flatgather.launch_server [SGLANG ARGUMENTS]

Runs `python -m sglang.launch_server` with the same arguments, with
FLATGATHER_SGLANG=1 set so that flatgather is installed in every SGLang
process (scheduler processes included). SGLang's own options follow.
"""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get("FLATGATHER_SGLANG", "").lower() != "force":
        os.environ["FLATGATHER_SGLANG"] = "1"
    if "-h" in args or "--help" in args:
        print(HELP)
    from flatgather import _activate

    _activate.arm()
    # FLATGATHER_LAUNCH_ENTRY swaps the entry point (the tests use a stand-in).
    entry = os.environ.get("FLATGATHER_LAUNCH_ENTRY", ENTRY)
    sys.argv = [entry, *args]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
