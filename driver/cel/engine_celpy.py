"""CEL engine on cel-python (`celpy`, pure Python), used only when chosen (TESSERA_CEL_ENGINE=celpy or engine=).

It has no iteration budget and runs about 1000x slower than cel-expr-python, so it is never a silent
fallback (see driver.cel.selector.engine_name).

celpy has no type checker (tessera's own analysis supplies the static checks), no optional
syntax, no `cel.bind` and no strings extension. This adapter:
- expands `cel.bind(v, init, body)` by substituting init for v (CEL is pure; cel-go evaluates
  init once, here it may be evaluated several times, with the same result),
- maps `strings.quote`, `sets.*` and `lists.range` to plain functions,
- supplies the Kubernetes quantity/semver/regex/lists libraries and the strings extension,
- reproduces Go's equality rules (Quantity/Semver `==` is "no such overload" unless the right
  side has the same Go type, and add()/sub() results are pointers that never compare equal),
- allows relational operators across int/uint/double, as Kubernetes enables,
- returns an empty map for an unknown attribute/capacity domain (the scheduler's Find()).
Optional syntax (`.?`, `[?]`, `optional.*`) and two-variable comprehensions are rejected at
compile time with a message naming the engine.

Evaluation is thread-safe: each evaluate() builds its own Evaluator; compilation (celpy's
Environment.program stores the last program on the environment) runs under a lock.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

from driver.cel import library
from driver.cel.device import DeviceView
from driver.cel.errors import CelCompileError, CelRuntimeError
from driver.cel.findings import Analysis
from driver.cel.printer import unparse
from driver.cel.rewrite import expand_two_variable_macros
from driver.cel.syntax import Call, Ident, Index, ListLit, Node, Select, map_children
from driver.quantity import INT64_MAX, INT64_MIN, Quantity
from driver.semver import Version

_QUALIFIED = {"strings.quote": "strings_quote", "sets.contains": "sets_contains",
              "sets.equivalent": "sets_equivalent", "sets.intersects": "sets_intersects", "lists.range": "lists_range"}
_UNSUPPORTED_MACROS = {"existsOne", "transformList", "transformMap", "transformMapEntry", "sortBy"}


class DomainMap(celtypes.MapType):
    """device.attributes / device.capacity: an unknown domain reads as an empty map, `in` stays exact."""

    def __getitem__(self, key: Any) -> Any:
        if not super().__contains__(key):
            return celtypes.MapType({})
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


def _to_cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v) for v in value])
    return value  # Quantity and Version travel as opaque Python objects


def _from_cel(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.ListType):
        return [_from_cel(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {_from_cel(k): _from_cel(v) for k, v in value.items()}
    return value


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adapt a library function: plain Python in, CEL values out, failures as CEL errors."""
    def call(*args: Any) -> Any:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        try:
            return _to_cel(fn(*(_from_cel(a) for a in args)))
        except (ValueError, TypeError, IndexError, OverflowError) as e:
            return CELEvalError(str(e), e.__class__, e.args)
    return call


def _expect(kind: type | tuple[type, ...], fn: Callable[..., Any]) -> Callable[..., Any]:
    """Receiver type check: celpy dispatches by name only, Kubernetes by declared overload."""
    def call(receiver: Any, *args: Any) -> Any:
        if not isinstance(receiver, kind):
            raise TypeError("no such overload")
        return fn(receiver, *args)
    return call


def _int64(v: int) -> int:
    if not INT64_MIN <= v <= INT64_MAX:
        raise OverflowError("integer overflow")
    return v


def _go_equal(a: Any, b: Any) -> Any:
    """cel-go's lhs.Equal(rhs) for the Kubernetes types, celpy's equality otherwise."""
    if isinstance(a, CELEvalError):
        return a
    if isinstance(b, CELEvalError):
        return b
    if isinstance(a, Quantity):
        if not isinstance(b, Quantity) or isinstance(b, library.ComputedQuantity):
            return CELEvalError("no such overload", TypeError, ())
        return celtypes.BoolType(a.cmp(b) == 0)
    if isinstance(a, Version):
        if not isinstance(b, Version):
            return CELEvalError("no such overload", TypeError, ())
        return celtypes.BoolType(a.compare(b) == 0)
    if isinstance(b, Quantity | Version):
        return celtypes.BoolType(False)
    if _numeric(a) and _numeric(b):
        if any(isinstance(x, float) and math.isnan(x) for x in (a, b)):
            return celtypes.BoolType(False)
        return celtypes.BoolType(Fraction(a) == Fraction(b))
    if type(a) is not type(b) and not (isinstance(a, celtypes.MapType) and isinstance(b, celtypes.MapType)):
        return celtypes.BoolType(False)
    return base_functions["_==_"](a, b)


def _go_not_equal(a: Any, b: Any) -> Any:
    """cel-go's `a != b`: operand errors propagate, but a failing a.Equal(b) makes it true."""
    if isinstance(a, CELEvalError):
        return a
    if isinstance(b, CELEvalError):
        return b
    eq = _go_equal(a, b)
    return celtypes.BoolType(True) if isinstance(eq, CELEvalError) else celtypes.BoolType(not eq)


def _go_in(item: Any, container: Any) -> Any:
    """cel-go's `in`: list membership by item.Equal(element), a failing Equal counting as no match."""
    if isinstance(item, CELEvalError):
        return item
    if isinstance(container, CELEvalError):
        return container
    if isinstance(container, celtypes.ListType):
        return celtypes.BoolType(any(_go_equal(item, element) is True or (
            isinstance(_go_equal(item, element), celtypes.BoolType) and bool(_go_equal(item, element)))
            for element in container))
    return base_functions["_in_"](item, container)


def _numeric(v: Any) -> bool:
    return isinstance(v, celtypes.IntType | celtypes.UintType | celtypes.DoubleType) and not isinstance(
        v, celtypes.BoolType)


def _relational(name: str, op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    original = base_functions[name]

    def call(a: Any, b: Any) -> Any:
        if isinstance(a, CELEvalError):
            return a
        if isinstance(b, CELEvalError):
            return b
        if isinstance(a, Quantity | Version) or isinstance(b, Quantity | Version):
            return CELEvalError("no such overload", TypeError, ())
        if _numeric(a) and _numeric(b) and type(a) is not type(b):
            # exact comparison across int/uint/double; NaN compares false with everything
            if any(isinstance(x, float) and math.isnan(x) for x in (a, b)):
                return celtypes.BoolType(False)
            return celtypes.BoolType(op(Fraction(a), Fraction(b)))
        if type(a) is not type(b):
            # Python would order a bool against a number; CEL has no such overload
            return CELEvalError("no such overload", TypeError, ())
        return original(a, b)
    return call


def _functions() -> dict[str, Any]:
    q, v = Quantity, Version
    lib = library
    fns: dict[str, Callable[..., Any]] = {
        "quantity": lib.quantity_from_string,
        "isQuantity": lib.is_quantity,
        "sign": _expect(q, Quantity.sign),
        "isGreaterThan": _expect((q, v), lambda a, b: lib.compare(a, b) == 1),
        "isLessThan": _expect((q, v), lambda a, b: lib.compare(a, b) == -1),
        "compareTo": _expect((q, v), lib.compare),
        "asApproximateFloat": _expect(q, Quantity.as_approximate_float),
        "asInteger": _expect(q, lib.quantity_as_integer),
        "isInteger": _expect(q, lambda x: x.as_int64() is not None),
        "add": _expect(q, lib.quantity_add),
        "sub": _expect(q, lib.quantity_sub),
        "semver": lib.semver_from_string,
        "isSemver": lib.is_semver,
        "major": _expect(v, Version.cel_major),
        "minor": _expect(v, Version.cel_minor),
        "patch": _expect(v, Version.cel_patch),
        "find": _expect(str, lib.regex_find),
        "findAll": _expect(str, lib.regex_find_all),
        "isSorted": _expect(list, lib.list_is_sorted),
        "includes": lib.includes,
        "sum": _expect(list, lambda items: _int64(sum(items)) if all(isinstance(i, int) for i in items)
                       else sum(items)),
        "min": _expect(list, lib.list_min),
        "max": _expect(list, lib.list_max),
        "indexOf": lambda r, *a: lib.list_index_of(r, *a) if isinstance(r, list) else lib.string_index_of(r, *a),
        "lastIndexOf": lambda r, *a: (lib.list_last_index_of(r, *a) if isinstance(r, list)
                                      else lib.string_last_index_of(r, *a)),
        "distinct": _expect(list, lib.lists_distinct),
        "flatten": _expect(list, lib.lists_flatten),
        "slice": _expect(list, lib.lists_slice),
        "sort": _expect(list, lib.lists_sort),
        "reverse": _expect(list, lambda items: list(reversed(items))),
        "lists_range": lib.lists_range,
        "sets_contains": lib.sets_contains,
        "sets_equivalent": lib.sets_equivalent,
        "sets_intersects": lib.sets_intersects,
        "charAt": _expect(str, lib.string_char_at),
        "lowerAscii": _expect(str, lib.string_lower_ascii),
        "upperAscii": _expect(str, lib.string_upper_ascii),
        "replace": _expect(str, lib.string_replace),
        "split": _expect(str, lib.string_split),
        "substring": _expect(str, lib.string_substring),
        "trim": _expect(str, lib.string_trim),
        "join": _expect(list, lib.string_join),
        "strings_quote": lib.strings_quote,
        "tessera_in_constant_list": lib.in_constant_list,
    }
    out: dict[str, Any] = {name: _guard(fn) for name, fn in fns.items()}
    out["_==_"] = _go_equal
    out["_!=_"] = _go_not_equal
    out["_in_"] = _go_in
    out["_<_"] = _relational("_<_", lambda a, b: a < b)
    out["_<=_"] = _relational("_<=_", lambda a, b: a <= b)
    out["_>_"] = _relational("_>_", lambda a, b: a > b)
    out["_>=_"] = _relational("_>=_", lambda a, b: a >= b)
    return out


_BINDING_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
ITERABLE = "tessera_iterable"


def _iterable(value: Any) -> Any:
    """The range of a comprehension, or cel-go's error for a value that is neither a list nor a map."""
    if isinstance(value, CELEvalError | celtypes.ListType | celtypes.MapType):
        return value
    kind = type(value).__name__.replace("Type", "")
    return CELEvalError(f"got '{kind}', expected iterable type", TypeError, ())


_FUNCTIONS = {**_functions(), ITERABLE: _iterable}


def substitute(n: Node, name: str, replacement: Node) -> Node:
    """n with every free occurrence of the identifier `name` replaced (inner bindings shadow it)."""
    if isinstance(n, Ident):
        return replacement if n.name == name else n
    if isinstance(n, Call) and n.args and isinstance(n.args[0], Ident) and n.args[0].name == name:
        if n.target is not None and n.function in _BINDING_MACROS:
            return Call(n.offset, n.function, n.args, substitute(n.target, name, replacement))
        if isinstance(n.target, Ident) and n.target.name == "cel" and n.function == "bind" and len(n.args) == 3:
            return Call(n.offset, n.function, (n.args[0], substitute(n.args[1], name, replacement), n.args[2]),
                        n.target)
    return map_children(n, lambda c: substitute(c, name, replacement))


def rewrite_for_celpy(expression: str, ast: Node, constant_membership_calls: frozenset[int] = frozenset()) -> Node:
    """cel.bind and qualified function names in forms celpy understands; reject what it cannot run."""
    def visit(n: Node) -> Node:
        if (isinstance(n, Select | Index) and n.optional) or (isinstance(n, ListLit) and any(n.optional)):
            raise CelCompileError(expression, n.offset + 1, "optional syntax (.?, [?], ?elements) is not "
                                  "supported by the celpy engine; use the celexpr engine")
        if isinstance(n, Call):
            if n.function == "@in" and n.offset in constant_membership_calls:
                return Call(n.offset, "tessera_in_constant_list", (visit(n.args[0]), n.args[1]))
            if (isinstance(n.target, Ident) and n.target.name == "cel" and n.function == "bind" and len(n.args) == 3
                    and isinstance(n.args[0], Ident)):
                # CEL is pure, so binding is substitution; unlike a comprehension, the substituted
                # form lets && and || absorb errors the way cel-go does
                return visit(substitute(n.args[2], n.args[0].name, n.args[1]))
            if isinstance(n.target, Ident) and f"{n.target.name}.{n.function}" in _QUALIFIED:
                return Call(n.offset, _QUALIFIED[f"{n.target.name}.{n.function}"], tuple(visit(a) for a in n.args))
            if isinstance(n.target, Ident) and n.target.name == "optional":
                raise CelCompileError(expression, n.offset + 1, "optional values are not supported by the celpy "
                                      "engine; use the celexpr engine")
            two_var = n.function in ("all", "exists") and len(n.args) == 3 and isinstance(n.args[1], Ident)
            if n.target is not None and (n.function in _UNSUPPORTED_MACROS or two_var):
                raise CelCompileError(expression, n.offset + 1, f"the {n.function}() macro is not supported by the "
                                      "celpy engine; use the celexpr engine")
            if n.function in ("hasValue", "value", "orValue", "or", "optMap", "optFlatMap"):
                raise CelCompileError(expression, n.offset + 1, f"optional values ({n.function}) are not supported "
                                      "by the celpy engine; use the celexpr engine")
            if (n.target is not None and n.function in _BINDING_MACROS and n.args and isinstance(n.args[0], Ident)
                    and not isinstance(n.target, ListLit)):
                # celpy iterates a string or skips a scalar; cel-go fails on a range that is not a list or map
                # (an attribute value is dyn while DRAListTypeAttributes is on)
                ranged = Call(n.offset, ITERABLE, (visit(n.target),))
                return Call(n.offset, n.function, tuple(visit(a) for a in n.args), ranged)
        return map_children(n, visit)

    return visit(ast)


_compile_lock = threading.Lock()
_environment: dict[str, Any] = {}


class CelPyProgram:
    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def evaluate(self, device: DeviceView) -> object:
        activation = device._cache.get("celpy")
        if activation is None:
            activation = device._cache.setdefault("celpy", {"device": _device_value(device)})
        try:
            result = self._runner.evaluate(activation)
        except CELEvalError as e:
            raise CelRuntimeError(_message(e)) from None
        except (TypeError, ValueError, KeyError, IndexError, OverflowError, ZeroDivisionError) as e:
            raise CelRuntimeError(str(e) or type(e).__name__) from None
        if isinstance(result, CELEvalError):
            raise CelRuntimeError(_message(result))
        return _from_cel(result)


def _message(e: CELEvalError) -> str:
    text = str(e.args[0] if e.args else e)
    m = re.search(r"no such member in mapping: '(.*)'", text)
    return f"no such key: {m.group(1)}" if m else text


def _device_value(device: DeviceView) -> Any:
    attrs = DomainMap({celtypes.StringType(d): celtypes.MapType(
        {celtypes.StringType(k): _to_cel(v) for k, v in values.items()}) for d, values in device.attributes.items()})
    caps = DomainMap({celtypes.StringType(d): celtypes.MapType(
        {celtypes.StringType(k): v for k, v in values.items()}) for d, values in device.capacity.items()})
    return celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("attributes"): attrs,
        celtypes.StringType("capacity"): caps,
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.allow_multiple_allocations),
    })


class CelPyEngine:
    name = "celpy"

    def compile(self, expression: str, ast: Node, analysis: Analysis) -> CelPyProgram:
        source = unparse(rewrite_for_celpy(expression, expand_two_variable_macros(ast),
                                           analysis.constant_membership_calls))
        with _compile_lock:
            if "env" not in _environment:
                _environment["env"] = celpy.Environment()
            env = _environment["env"]
            try:
                tree = env.compile(source)
                runner = env.program(tree, functions=_FUNCTIONS)
            except Exception as e:  # celpy raises its own parse errors
                raise CelCompileError(expression, 0, f"cel-python could not compile the expression: {e}") from None
        return CelPyProgram(runner)
