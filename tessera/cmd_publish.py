"""`tessera publish` (being written)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    raise SystemExit("tessera publish: not available in this build yet")
