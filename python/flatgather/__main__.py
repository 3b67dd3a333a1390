"""``python -m flatgather``: bench, report, doctor."""

from __future__ import annotations

import sys

USAGE = """usage: python -m flatgather COMMAND [ARGS]

commands:
  bench    time _get_pruned_states: SGLang's own vs flatgather vs numpy vs memcpy
  report   regenerate the table / Markdown / plot from a saved `bench --json` file
  doctor   print versions, whether the extension loaded and SGLang is supported
"""


def report_main(argv: list[str]) -> int:
    import argparse
    import json
    from pathlib import Path

    from flatgather.bench import report

    parser = argparse.ArgumentParser(prog="python -m flatgather report")
    parser.add_argument("json", type=Path, help="a file written by `bench --json`")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text())
    print(report.table(results))
    if args.markdown:
        args.markdown.write_text(report.markdown(results))
    if args.plot:
        report.plot(results, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from flatgather.bench.run import main as bench_main

        return bench_main(rest)
    if command == "report":
        return report_main(rest)
    if command == "doctor":
        from flatgather.doctor import main as doctor_main

        return doctor_main(rest)
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
