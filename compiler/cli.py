"""The ``tensorfuse`` command line (a later issue fills it in)."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorfuse", description="tensorfuse: compile ONNX models to native code.")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
