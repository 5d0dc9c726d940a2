"""compile_selector: a DRA device selector checked as the apiserver does and run as the scheduler does."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from driver.cel.analysis import analyze
from driver.cel.device import DeviceView
from driver.cel.engine import Engine, Program
from driver.cel.environment import STORED, CelEnvironment
from driver.cel.errors import CelBudgetExceeded, CelCompileError, CelRuntimeError
from driver.cel.findings import AttributeRead
from driver.cel.limits import MAX_COST, MAX_EXPRESSION_BYTES
from driver.cel.syntax import CelSyntaxError, line_and_column, parse, tokenize, tree_depth
from driver.errors import TesseraError

ENGINE_ENV_VAR = "TESSERA_CEL_ENGINE"
ENGINES = ("celexpr", "celpy")
# cel-expr-python agrees with Kubernetes on more of tests/driver/cel/corpus.json (see tests/driver/cel/README.md).
DEFAULT_ENGINE = "celexpr"
CACHE_SIZE = 512
# Nesting tessera's recursive checker follows. Real selectors nest a handful of levels; the limits
# keep a hostile one from reaching Python's recursion limit (a RecursionError, once an HTTP 500), and
# the bracket limit sits below the depth at which the parser itself would run out of stack.
MAX_BRACKET_DEPTH = 64
MAX_TREE_DEPTH = 100


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled selector. evaluate() is thread-safe for both engines."""

    expression: str
    engine: str
    reads: tuple[AttributeRead, ...]
    result_type: str
    estimated_cost: int
    _program: Program

    def evaluate(self, device: DeviceView) -> bool:
        """True/False for this device; CelRuntimeError when the scheduler would get an error;
        CelBudgetExceeded when cel-cpp's iteration budget stopped it (the outcome is unknown)."""
        if device.error:
            raise CelRuntimeError(device.error)
        try:
            result = self._program.evaluate(device)
        except CelBudgetExceeded as e:
            raise CelBudgetExceeded(f"{e.message} (estimated cost {self.estimated_cost:,}; Kubernetes allows "
                                    f"{MAX_COST:,} and has no iteration budget)") from None
        if not isinstance(result, bool):
            raise CelRuntimeError(f"CEL result of type {_cel_type_name(result)} could not be converted to bool")
        return result


def _cel_type_name(value: object) -> str:
    names = {int: "int", float: "double", str: "string", bytes: "bytes", list: "list", dict: "map",
             type(None): "null_type"}
    return names.get(type(value), type(value).__name__)


def engine_name(engine: str | None) -> str:
    """The engine to use: the parameter, else $TESSERA_CEL_ENGINE, else the default.

    cel-python is used only when asked for by name: it has no iteration budget and evaluates about
    1000x slower, so falling back to it silently would let one selector hold a CPU for minutes.
    Without cel-expr-python (it ships binary wheels only) and without a choice, compiling fails
    with a message that says both ways out.
    """
    requested = engine or os.environ.get(ENGINE_ENV_VAR)
    name = requested or DEFAULT_ENGINE
    if name not in ENGINES:
        raise ValueError(f"unknown CEL engine {name!r} (from {'parameter' if engine else ENGINE_ENV_VAR}); "
                         f"use one of {', '.join(ENGINES)}")
    if not requested and name == "celexpr" and not celexpr_available():
        raise CelEngineMissing(
            f"the default CEL engine needs cel-expr-python, which is not installed (it has wheels for Linux and "
            f"macOS on x86_64 and arm64); install it, or set {ENGINE_ENV_VAR}=celpy to choose the much slower "
            "cel-python engine explicitly")
    return name


class CelEngineMissing(TesseraError, RuntimeError):
    """No engine was chosen and the default one is not installed."""


def celexpr_available() -> bool:
    return importlib.util.find_spec("cel_expr_python") is not None


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _engine(name: str) -> Engine:
    with _engines_lock:
        if name not in _engines:
            if name == "celexpr":
                from driver.cel.engine_celexpr import CelExprEngine

                _engines[name] = CelExprEngine()
            else:
                from driver.cel.engine_celpy import CelPyEngine

                _engines[name] = CelPyEngine()
        return _engines[name]


_Key = tuple[str, CelEnvironment, str]


class _LRU:
    """Compiled selectors by (engine, environment, expression); compile errors are not cached."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[_Key, CompiledSelector] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: _Key) -> CompiledSelector | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: _Key, value: CompiledSelector) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_cache = _LRU(CACHE_SIZE)


def compile_selector(expression: str, *, engine: str | None = None,
                     environment: CelEnvironment = STORED) -> CompiledSelector:
    """Compile a CEL device selector; raises CelCompileError where Kubernetes would reject it.

    `environment` says which of Kubernetes' environments compiles it: the default is the stored one
    (what the scheduler uses, with 1.36's feature gates); the apiserver compiles a new or changed
    selector in the new-expressions one (driver.cel.environment)."""
    if not isinstance(expression, str):
        raise CelCompileError(repr(expression), 0, f"a selector expression must be a string, not "
                                                   f"{type(expression).__name__}")
    name = engine_name(engine)
    key = (name, environment, expression)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    selector = _compile(expression, name, environment)
    _cache.put(key, selector)
    return selector


def _compile(expression: str, engine: str, environment: CelEnvironment) -> CompiledSelector:
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(expression, 0, f"expression is too long: {size} bytes, the limit is "
                                             f"{MAX_EXPRESSION_BYTES} bytes")
    _check_brackets(expression)
    try:
        ast = parse(expression)
    except CelSyntaxError as e:
        line, column = line_and_column(expression, e.offset)
        raise CelCompileError(expression, column, f"syntax error: {e.message}", line=line) from None
    depth = tree_depth(ast)
    if depth > MAX_TREE_DEPTH:
        raise CelCompileError(expression, 0, _too_deep(f"its syntax tree is {depth} levels deep", MAX_TREE_DEPTH))
    try:
        analysis = analyze(expression, ast, environment)
        if analysis.issues:
            first = min(analysis.issues, key=lambda i: i.offset)
            line, column = line_and_column(expression, first.offset)
            raise CelCompileError(expression, column, first.message, line=line)
        if analysis.estimated_cost > MAX_COST:
            raise CelCompileError(expression, 0, f"too complex, exceeds cost limit: estimated cost "
                                                 f"{analysis.estimated_cost} > {MAX_COST}; iterate over fewer or "
                                                 f"smaller collections or avoid nested comprehensions")
        program = _engine(engine).compile(expression, ast, analysis)
    except RecursionError:
        # the tree is within MAX_TREE_DEPTH, but the caller's own stack left too little room
        raise CelCompileError(expression, 0, _too_deep(f"its syntax tree is {depth} levels deep",
                                                       MAX_TREE_DEPTH)) from None
    return CompiledSelector(expression, engine, analysis.reads, analysis.result_type, analysis.estimated_cost,
                            program)


def _too_deep(what: str, limit: int) -> str:
    return f"expression nested too deeply: {what}, tessera checks at most {limit}; split it into several selectors"


def _check_brackets(expression: str) -> None:
    """Reject bracket nesting beyond MAX_BRACKET_DEPTH before the recursive parser sees it."""
    try:
        tokens = tokenize(expression)
    except CelSyntaxError:
        return  # the parser reports it, with its position
    depth = deepest = 0
    for token in tokens:
        if token.kind == "op" and token.text in ("(", "[", "{", "[?"):
            depth += 1
            deepest = max(deepest, depth)
        elif token.kind == "op" and token.text in (")", "]", "}"):
            depth -= 1
    if deepest > MAX_BRACKET_DEPTH:
        raise CelCompileError(expression, 0, _too_deep(f"brackets nest {deepest} levels deep", MAX_BRACKET_DEPTH))

