"""The interface between tessera's CEL environment and a CEL engine.

compile_selector parses and checks an expression itself (syntax, static checks, cost), then asks
an engine to compile and run it. Two engines exist: cel-expr-python (cel-cpp, with a real type
checker) and cel-python (pure Python). Both receive the same parsed tree and analysis.
"""

from __future__ import annotations

from typing import Protocol

from driver.cel.device import DeviceView
from driver.cel.findings import Analysis
from driver.cel.syntax import Node


class Program(Protocol):
    def evaluate(self, device: DeviceView) -> object:
        """The expression's value as a Python object; raises CelRuntimeError on an evaluation error."""
        ...


class Engine(Protocol):
    name: str

    def compile(self, expression: str, ast: Node, analysis: Analysis) -> Program:
        """Raises CelCompileError for expressions the engine rejects."""
        ...
