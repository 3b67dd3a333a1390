"""The ``flatgather`` command; ``python -m flatgather`` is the same.

flatgather bench --sglang 0.5.23       # SGLang's own code vs flatgather, side by side
flatgather report bench.json           # the tables and plot again, from a saved run
flatgather doctor                      # is this environment right for serving?
flatgather launch-server ARGS          # sglang.launch_server with the switch on
flatgather install-pth [--remove]      # the switch's .pth file, for editable installs
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {
    "bench": (
        "flatgather.bench.run",
        "time the prefill step: SGLang's own code vs flatgather, side by side",
    ),
    "report": (
        "flatgather.bench.report",
        "regenerate the table, Markdown and plot from a saved `bench --json` file",
    ),
    "doctor": (
        "flatgather.doctor",
        "check versions, the extension, the SGLang probe, the switch and its .pth file",
    ),
    "launch-server": (
        "flatgather.launch_server",
        "run sglang.launch_server with FLATGATHER_SGLANG=1 (same arguments)",
    ),
    "install-pth": (
        "flatgather._pth",
        "write (or --remove) the switch's .pth file in this environment's site-packages",
    ),
}


def prog() -> str:
    """How the user called us, for usage lines and recorded commands."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "flatgather" if name == "flatgather" else "python -m flatgather"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {prog()} COMMAND [ARGS]   ({prog()} COMMAND --help for more)", ""]
    lines.append("commands:")
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        import flatgather

        print(f"flatgather {flatgather.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    entry = COMMANDS.get(command)
    if entry is None:
        print(f"{prog()}: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
