"""The ``gpufeed`` command line: ``diagnose``, ``analyze``, ``tune``, ``batch-size``, ``run``, ``demo``,
``report``, ``trace`` and ``watch``.

The subcommands are in ``running.py`` (those that run the training command) and ``reading.py``
(those that read records); the flags in ``parser.py``; exit codes and shared output in ``common.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from gpufeed.cli import reading, running
from gpufeed.cli.common import (EXIT_BAD_RECORD, EXIT_COMMAND_FAILED, EXIT_FOR_END, EXIT_INTERNAL, EXIT_INTERRUPTED,
                                EXIT_NO_BATCH_SIZE, EXIT_NOT_STARTED, EXIT_NOTHING_TO_TUNE, EXIT_OK, EXIT_STALLED,
                                EXIT_TERMINATED, EXIT_USAGE, output_files_problem, say_error, stdout_console)
from gpufeed.cli.parser import build_parser

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_INTERNAL", "EXIT_USAGE", "EXIT_NOT_STARTED", "EXIT_COMMAND_FAILED",
           "EXIT_STALLED", "EXIT_BAD_RECORD", "EXIT_INTERRUPTED", "EXIT_NOTHING_TO_TUNE", "EXIT_NO_BATCH_SIZE",
           "EXIT_TERMINATED", "EXIT_FOR_END"]

DEMO_SCRIPT = Path(__file__).parent.parent / "demo" / "train.py"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = stdout_console()
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    problem = output_files_problem(args)
    if problem:
        say_error(problem)
        return EXIT_USAGE
    try:
        if args.verb == "analyze":
            return reading.analyze(args, console)
        if args.verb == "report":
            return reading.report(args, console)
        if args.verb == "what-if":
            return reading.what_if(args, console)
        if args.verb == "trace":
            return reading.trace(args, console)
        if args.verb == "watch":
            return reading.watch(args)
        if args.verb == "demo":
            return running.diagnose([sys.executable, str(DEMO_SCRIPT)], args, console)
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if args.verb == "tune":
            return running.tune(command, args, console)
        if args.verb == "batch-size":
            return running.batch_size(command, args, console)
        if args.verb == "run":
            return running.run(command, args)
        return running.diagnose(command, args, console)
    except KeyboardInterrupt:
        say_error("interrupted.")
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
