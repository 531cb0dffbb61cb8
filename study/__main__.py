"""The study's commands, ``python -m study COMMAND [ARGS]``: each the ``main`` of one module
(``python -m study`` alone lists them)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: each command and the module whose ``main(argv)`` runs it
COMMANDS = {
    "headline": "study.cli.headline",
    "depth-contrast": "study.cli.depth_contrast",
    "bucket-contrasts": "study.bucket_contrasts",
    "extrapolation-penalty": "study.penalty",
    "alignment-probe": "study.cli.alignment_probe",
    "guide-sections": "study.cli.guide_sections",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv[0]`` names with the rest of ``argv`` (a one-line error naming the
    known commands for any other)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        given = f"unknown command {args[0]!r}" if args else "no command given"
        sys.exit(f"study: {given}; the commands: {', '.join(COMMANDS)}")
    module = importlib.import_module(COMMANDS[args[0]])
    sys.argv[0] = f"python -m study {args[0]}"
    return module.main(args[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main())
