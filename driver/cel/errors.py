"""Errors raised by the CEL environment."""

from __future__ import annotations

from driver.errors import InvalidInputError, TesseraError


class CelCompileError(TesseraError):
    """A selector Kubernetes would reject at admission (syntax, types, length, cost).

    `column` is 1-based within the expression's line (0 when no position applies, such as the
    length limit); str() shows the expression with a caret under the column and the message.
    """

    def __init__(self, expression: str, column: int, message: str, *, line: int = 1) -> None:
        super().__init__(message)
        self.expression = expression
        self.column = column
        self.line = line
        self.message = message

    def __str__(self) -> str:
        if self.column <= 0:
            return f"compilation failed: {self.message}"
        lines = self.expression.split("\n")
        text = lines[self.line - 1] if 0 < self.line <= len(lines) else self.expression
        where = f"line {self.line}, column {self.column}" if len(lines) > 1 else f"column {self.column}"
        return f"compilation failed at {where}: {self.message}\n | {text}\n | {' ' * (self.column - 1)}^"


class CelRuntimeError(TesseraError):
    """A selector failed while evaluating one device (the scheduler would abort the pod's allocation)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CelBudgetExceeded(TesseraError):
    """cel-cpp stopped an evaluation at its fixed comprehension-iteration budget.

    Kubernetes has no such budget (only the runtime cost limit, which compile_selector's cost
    estimate already bounds), so the selector's outcome on this device is unknown to tessera, not an
    error the scheduler would see. Nothing is re-run on a slower engine.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DeviceViewError(InvalidInputError):
    """A ResourceSlice device cannot be turned into CEL input; `path` names the offending field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
