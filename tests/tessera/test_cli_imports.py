"""Building the command line loads no gRPC: `tessera --help`, `tessera check` and `tessera inventory` start
without it (and without the C++ runtime grpc needs, which an image build check relies on)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import REPO


@pytest.mark.parametrize("argv", [["--help"], ["inventory", "--simulate", "t4-4"]])
def test_the_cli_loads_no_grpc_unless_the_node_agent_runs(argv: list[str]) -> None:
    code = ("import runpy, sys; sys.argv = ['tessera', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('tessera', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False)
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr[-2000:]
