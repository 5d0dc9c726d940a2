"""`tessera check` (being written)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    raise SystemExit("tessera check: not available in this build yet")
