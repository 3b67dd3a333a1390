"""``flatgather launch-server ARGS`` (or ``python -m flatgather.launch_server
ARGS``): SGLang's server with flatgather on.

Sets ``FLATGATHER_SGLANG=1`` (keeping ``force`` if already set) for this
process and every process it starts, then runs ``sglang.launch_server`` with
exactly the same arguments. SGLang spawns its schedulers as fresh
interpreters, which pick the switch up through the ``flatgather-sglang.pth``
file; without that file (an editable install) they would run unpatched, so
the launcher refuses to start and says how to fix it.
"""

from __future__ import annotations

import os
import runpy
import sys

ENTRY = "sglang.launch_server"

HELP = """usage: flatgather launch-server [SGLANG ARGUMENTS]
       python -m flatgather.launch_server [SGLANG ARGUMENTS]

Runs `python -m sglang.launch_server` with the same arguments, with
FLATGATHER_SGLANG=1 set so that flatgather is installed in every SGLang
process (scheduler processes included, through the flatgather-sglang.pth
file: `flatgather doctor` checks it). SGLang's own options follow.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get("FLATGATHER_SGLANG", "").lower() != "force":
        os.environ["FLATGATHER_SGLANG"] = "1"
    if "-h" in args or "--help" in args:
        print(HELP)
    else:
        from flatgather import _pth

        if not any(found.ok for found in _pth.find()):
            print(
                f"flatgather launch-server: no {_pth.NAME} in this environment's site-packages "
                "(an editable install does not ship it), so SGLang's scheduler processes would "
                f"run unpatched. Fix: {_pth.FIX}",
                file=sys.stderr,
            )
            return 2
    from flatgather import _activate

    _activate.arm()
    # FLATGATHER_LAUNCH_ENTRY swaps the entry point (the tests use a stand-in).
    entry = os.environ.get("FLATGATHER_LAUNCH_ENTRY", ENTRY)
    sys.argv = [entry, *args]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
