"""CEL engine on cel-expr-python (Google's cel-cpp): a real type checker and fast evaluation.

Quantity and Semver cannot cross the binding as Python objects, so they travel as protobuf
messages of a descriptor built at import time. A message must hold a normalized exact value,
because cel-cpp's `==` on messages compares fields: a Quantity carries its reduced fraction,
a Semver its numbers and prerelease (build metadata is ignored by semver equality anyway).

Where cel-cpp and cel-go disagree, the expression is rewritten before cel-cpp sees it (see
rewrite_for_celexpr), each rewrite found and checked against the Go oracle:
- an unknown attribute/capacity domain reads as an empty map (cel-cpp would fail);
- relational operators work across int/uint/double (cel-cpp's checker rejects them);
- `==`/`!=` follow cel-go's left.Equal(right) when the left value may be a Semver or Quantity;
- has() on a non-map value is false; `x in [literals]` fails on a Semver (cel-go hashes it);
- the value taken out of an optional (value(), orValue()) is dyn, as cel-go types it on a dyn map;
- list indexOf()/lastIndexOf(), whose names cel-cpp's strings extension owns;
- two-variable comprehensions (driver.cel.rewrite).
cel-cpp stops every evaluation after ITERATION_BUDGET comprehension iterations in total, a limit
cel-expr-python fixes inside its C++ runtime and does not let Python raise. Kubernetes has no such
limit, only a runtime cost limit (1,000,000 for DRA selectors) that the static estimate already
bounds. An evaluation that hits the budget raises CelBudgetExceeded within milliseconds; it is never
re-run on another engine (cel-python took seconds to minutes for such selectors, which let one
claim occupy the webhook). Messages cannot carry Go's Quantity representation, so
each evaluation remembers the Quantity objects it produced (see _seen) and add()/sub() results
stay distinguishable.

Evaluation is thread-safe (compiled cel-cpp programs are immutable; each call gets its own
activation) but holds the GIL.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import structlog
from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from driver.cel import library
from driver.cel.device import DeviceView
from driver.cel.errors import CelBudgetExceeded, CelCompileError, CelRuntimeError
from driver.cel.findings import Analysis
from driver.cel.printer import unparse
from driver.cel.rewrite import expand_two_variable_macros
from driver.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select, map_children
from driver.quantity import INT64_MAX, INT64_MIN, Quantity
from driver.semver import Version

log = structlog.get_logger(__name__)

_FILE = "tessera/cel/kubernetes_types.proto"


def _build_messages() -> tuple[descriptor_pool.DescriptorPool, Any, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(name=_FILE, package="kubernetes", syntax="proto3")
    string_t = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    uint_t = descriptor_pb2.FieldDescriptorProto.TYPE_UINT64
    optional_label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    q = fdp.message_type.add(name="Quantity")
    q.field.add(name="numerator", number=1, type=string_t, label=optional_label)
    q.field.add(name="denominator", number=2, type=string_t, label=optional_label)
    s = fdp.message_type.add(name="Semver")
    for i, name in enumerate(("major", "minor", "patch"), start=1):
        s.field.add(name=name, number=i, type=uint_t, label=optional_label)
    s.field.add(name="prerelease", number=4, type=string_t, label=optional_label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    quantity_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Quantity"))
    semver_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Semver"))
    return pool, quantity_cls, semver_cls


_POOL, QuantityMsg, SemverMsg = _build_messages()
_QT = cel.Type("kubernetes.Quantity")
_ST = cel.Type("kubernetes.Semver")


# A message holds only the exact value, but isInteger()/asInteger() depend on Go's representation.
# Each evaluation remembers the last Quantity seen per value (literals, capacities, add/sub results)
# so that a value coming back from cel-cpp gets its representation again. Only two different
# representations of one value within one evaluation can still be confused.
_seen = threading.local()


def _remembered() -> dict[tuple[str, str], Quantity]:
    table: dict[tuple[str, str], Quantity] | None = getattr(_seen, "table", None)
    if table is None:
        table = {}
        _seen.table = table
    return table


def quantity_to_msg(q: Quantity, *, remember: bool = True) -> Any:
    f = q.fraction()
    msg = QuantityMsg(numerator=str(f.numerator), denominator=str(f.denominator))
    if remember:
        _remembered()[(msg.numerator, msg.denominator)] = q
    return msg


def quantity_from_msg(m: Any) -> Quantity:
    """The Quantity for a message: the one this evaluation produced, else rebuilt from the value."""
    known = _remembered().get((m.numerator, m.denominator))
    if known is not None:
        return known
    f = Fraction(int(m.numerator), int(m.denominator))
    if f.denominator == 1 and INT64_MIN <= f.numerator <= INT64_MAX:
        return Quantity(int_amount=(f.numerator, 0))
    scale = 0
    while (f * 10**scale).denominator != 1:
        scale += 1
    return Quantity(dec_amount=(int(f * 10**scale), scale))


def semver_to_msg(v: Version) -> Any:
    return SemverMsg(major=v.major, minor=v.minor, patch=v.patch, prerelease=".".join(p.text for p in v.pre))


def semver_from_msg(m: Any) -> Version:
    text = f"{m.major}.{m.minor}.{m.patch}" + (f"-{m.prerelease}" if m.prerelease else "")
    return Version.parse(text)


def _to_py(value: Any) -> Any:
    if isinstance(value, QuantityMsg):
        return quantity_from_msg(value)
    if isinstance(value, SemverMsg):
        return semver_from_msg(value)
    if isinstance(value, list):
        return [_to_py(v) for v in value]
    return value


def _to_cel(value: Any) -> Any:
    if isinstance(value, Quantity):
        return quantity_to_msg(value)
    if isinstance(value, Version):
        return semver_to_msg(value)
    if isinstance(value, list):
        return [_to_cel(v) for v in value]
    return value


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return _to_cel(fn(*(_to_py(a) for a in args)))
    return call


def _ov(overload_id: str, result: Any, params: list[Any], fn: Callable[..., Any] | None, member: bool = False) -> Any:
    if fn is None:
        return cel.Overload(overload_id, result, params, is_member=member)
    return cel.Overload(overload_id, result, params, is_member=member, impl=_wrap(fn))


def _declarations() -> list[Any]:
    t = cel.Type
    dyn_list = t.List(t.DYN)
    str_list = t.List(t.STRING)
    # cel-cpp dispatches on value kinds: Quantity and Semver are both messages, so the comparison
    # functions get a single implementation (on the quantity overload) that dispatches in Python.
    return [
        cel.FunctionDecl("quantity", [_ov("string_to_quantity", _QT, [t.STRING], library.quantity_from_string)]),
        cel.FunctionDecl("isQuantity", [_ov("is_quantity_string", t.BOOL, [t.STRING], library.is_quantity)]),
        cel.FunctionDecl("sign", [_ov("quantity_sign", t.INT, [_QT], Quantity.sign)]),
        cel.FunctionDecl("isGreaterThan", [
            _ov("quantity_is_greater_than", t.BOOL, [_QT, _QT], lambda a, b: library.compare(a, b) == 1, True),
            _ov("semver_is_greater_than", t.BOOL, [_ST, _ST], None, True)]),
        cel.FunctionDecl("isLessThan", [
            _ov("quantity_is_less_than", t.BOOL, [_QT, _QT], lambda a, b: library.compare(a, b) == -1, True),
            _ov("semver_is_less_than", t.BOOL, [_ST, _ST], None, True)]),
        cel.FunctionDecl("compareTo", [
            _ov("quantity_compare_to", t.INT, [_QT, _QT], library.compare, True),
            _ov("semver_compare_to", t.INT, [_ST, _ST], None, True)]),
        cel.FunctionDecl("asApproximateFloat", [
            _ov("quantity_get_float", t.DOUBLE, [_QT], Quantity.as_approximate_float, True)]),
        cel.FunctionDecl("asInteger", [_ov("quantity_get_int", t.INT, [_QT], library.quantity_as_integer, True)]),
        cel.FunctionDecl("isInteger", [
            _ov("quantity_is_integer", t.BOOL, [_QT], lambda q: q.as_int64() is not None, True)]),
        cel.FunctionDecl("add", [
            _ov("quantity_add", _QT, [_QT, _QT], library.quantity_add, True),
            _ov("quantity_add_int", _QT, [_QT, t.INT], library.quantity_add, True)]),
        cel.FunctionDecl("sub", [
            _ov("quantity_sub", _QT, [_QT, _QT], library.quantity_sub, True),
            _ov("quantity_sub_int", _QT, [_QT, t.INT], library.quantity_sub, True)]),
        cel.FunctionDecl("semver", [
            _ov("string_to_semver", _ST, [t.STRING], library.semver_from_string),
            _ov("string_bool_to_semver", _ST, [t.STRING, t.BOOL], library.semver_from_string)]),
        cel.FunctionDecl("isSemver", [
            _ov("is_semver_string", t.BOOL, [t.STRING], library.is_semver),
            _ov("is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], library.is_semver)]),
        cel.FunctionDecl("major", [_ov("semver_major", t.INT, [_ST], Version.cel_major, True)]),
        cel.FunctionDecl("minor", [_ov("semver_minor", t.INT, [_ST], Version.cel_minor, True)]),
        cel.FunctionDecl("patch", [_ov("semver_patch", t.INT, [_ST], Version.cel_patch, True)]),
        cel.FunctionDecl("find", [_ov("string_find_string", t.STRING, [t.STRING, t.STRING], library.regex_find, True)]),
        cel.FunctionDecl("findAll", [
            _ov("string_find_all_string", str_list, [t.STRING, t.STRING], library.regex_find_all, True),
            _ov("string_find_all_string_int", str_list, [t.STRING, t.STRING, t.INT], library.regex_find_all, True)]),
        cel.FunctionDecl("isSorted", [_ov("list_is_sorted", t.BOOL, [dyn_list], library.list_is_sorted, True)]),
        cel.FunctionDecl("sum", [_ov("list_sum", t.DYN, [dyn_list], _list_sum, True)]),
        cel.FunctionDecl("min", [_ov("list_min", t.DYN, [dyn_list], library.list_min, True)]),
        cel.FunctionDecl("max", [_ov("list_max", t.DYN, [dyn_list], library.list_max, True)]),
        cel.FunctionDecl("distinct", [_ov("list_distinct", dyn_list, [dyn_list], library.lists_distinct, True)]),
        cel.FunctionDecl("flatten", [
            _ov("list_flatten", dyn_list, [dyn_list], library.lists_flatten, True),
            _ov("list_flatten_int", dyn_list, [dyn_list, t.INT], library.lists_flatten, True)]),
        cel.FunctionDecl("slice", [_ov("list_slice", dyn_list, [dyn_list, t.INT, t.INT], library.lists_slice, True)]),
        cel.FunctionDecl("sort", [_ov("list_sort", dyn_list, [dyn_list], library.lists_sort, True)]),
        cel.FunctionDecl("reverse", [_ov("list_reverse", dyn_list, [dyn_list], lambda v: list(reversed(v)), True)]),
        cel.FunctionDecl("lists.range", [_ov("lists_range", t.List(t.INT), [t.INT], library.lists_range)]),
        cel.FunctionDecl("sets.contains", [
            _ov("list_sets_contains_list", t.BOOL, [dyn_list, dyn_list], library.sets_contains)]),
        cel.FunctionDecl("sets.equivalent", [
            _ov("list_sets_equivalent_list", t.BOOL, [dyn_list, dyn_list], library.sets_equivalent)]),
        _go_equality_declaration(GO_EQUALS, _go_equals),
        _go_equality_declaration(GO_NOT_EQUALS, _go_not_equals),
        _in_constant_list_declaration(),
        _includes_declaration(),
        _has_declaration(),
        _list_search_declaration(LIST_INDEX_OF, library.list_index_of),
        _list_search_declaration(LIST_LAST_INDEX_OF, library.list_last_index_of),
        cel.FunctionDecl("sets.intersects", [
            _ov("list_sets_intersects_list", t.BOOL, [dyn_list, dyn_list], library.sets_intersects)]),
    ]


GO_EQUALS = "tesseraGoEquals"
GO_NOT_EQUALS = "tesseraGoNotEquals"
IN_CONSTANT_LIST = "tesseraInConstantList"


def _go_equals(a: Any, b: Any) -> bool:
    """cel-go's `a == b`: a.Equal(b), where a Quantity/Semver receiver fails on another type."""
    return library.go_equal(a, b)


def _go_not_equals(a: Any, b: Any) -> bool:
    """cel-go's `a != b`: true unless a.Equal(b) is true, so a failing Equal gives true."""
    try:
        return not library.go_equal(a, b)
    except TypeError:
        return True


HAS = "tesseraHas"
LIST_INDEX_OF = "tesseraListIndexOf"
LIST_LAST_INDEX_OF = "tesseraListLastIndexOf"


def _has(receiver: Any, field: str) -> bool:
    """cel-go's has(x.f) on a value whose type is only known at run time: a map key test, else false."""
    return isinstance(receiver, dict) and field in receiver


def _has_declaration() -> Any:
    t = cel.Type
    receivers = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
                 "bytes": t.BYTES, "list": t.List(t.DYN), "map": t.Map(t.DYN, t.DYN), "quantity": _QT,
                 "semver": _ST}
    return cel.FunctionDecl(HAS, [
        _ov(f"tessera_has_{name}", t.BOOL, [rtype, t.STRING], None if name == "semver" else _has)
        for name, rtype in receivers.items()
    ])


def _list_search_declaration(name: str, impl: Callable[..., Any]) -> Any:
    """list.indexOf(x) for every element kind (dyn-typed parameters do not dispatch at run time)."""
    t = cel.Type
    elements = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
                "bytes": t.BYTES, "list": t.List(t.DYN), "map": t.Map(t.DYN, t.DYN), "quantity": _QT, "semver": _ST}
    return cel.FunctionDecl(name, [
        _ov(f"{name}_{elem}", t.INT, [t.List(t.DYN), etype], None if elem == "semver" else impl, True)
        for elem, etype in elements.items()
    ])


def _in_constant_list_declaration() -> Any:
    t = cel.Type
    kinds = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
             "bytes": t.BYTES, "list": t.List(t.DYN), "map": t.Map(t.DYN, t.DYN), "quantity": _QT, "semver": _ST}
    return cel.FunctionDecl(IN_CONSTANT_LIST, [
        _ov(f"{IN_CONSTANT_LIST}_{name}", t.BOOL, [ktype, t.List(t.DYN)],
            None if name == "semver" else library.in_constant_list)
        for name, ktype in kinds.items()
    ])


def _kind(type_name: str) -> str:
    return "message" if type_name in ("quantity", "semver") else type_name


def _includes_declaration() -> Any:
    """includes() on a dyn receiver: one overload per (receiver kind, argument kind), see GO_EQUALS."""
    t = cel.Type
    receivers = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
                 "list": t.List(t.DYN), "quantity": _QT, "semver": _ST}
    arguments = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
                 "bytes": t.BYTES, "list": t.List(t.DYN), "map": t.Map(t.DYN, t.DYN), "quantity": _QT, "semver": _ST}
    overloads = []
    implemented: set[tuple[str, str]] = set()
    for rname, rtype in receivers.items():
        for aname, atype in arguments.items():
            # the runtime registers one implementation per argument-kind signature, and both
            # message types share the kind "message"
            kinds = (_kind(rname), _kind(aname))
            impl = None if kinds in implemented else library.includes
            implemented.add(kinds)
            overloads.append(_ov(f"dra_includes_{rname}_{aname}", t.BOOL, [rtype, atype], impl, True))
    return cel.FunctionDecl("includes", overloads)


def _go_equality_declaration(name: str, impl_fn: Callable[[Any, Any], bool]) -> Any:
    """Overloads of name(left, right) for every pair of value kinds.

    cel-cpp dispatches on argument kinds, so each pair needs its own overload, and it registers one
    implementation per kind signature: the two message types share the kind "message".
    """
    t = cel.Type
    kinds = {"string": t.STRING, "int": t.INT, "uint": t.UINT, "double": t.DOUBLE, "bool": t.BOOL,
             "bytes": t.BYTES, "list": t.List(t.DYN), "map": t.Map(t.DYN, t.DYN), "quantity": _QT,
             "semver": _ST}
    overloads = []
    implemented: set[tuple[str, str]] = set()
    for lname, ltype in kinds.items():
        for rname, rtype in kinds.items():
            signature = (_kind(lname), _kind(rname))
            impl = None if signature in implemented else impl_fn
            implemented.add(signature)
            overloads.append(_ov(f"{name}_{lname}_{rname}", t.BOOL, [ltype, rtype], impl))
    return cel.FunctionDecl(name, overloads)


def _list_sum(items: list[Any]) -> Any:
    if not items:
        return 0
    if not all(type(i) is type(items[0]) and not isinstance(i, bool | str) for i in items):
        raise TypeError("no such overload")
    total = sum(items)
    if isinstance(total, int) and not INT64_MIN <= total <= INT64_MAX:
        raise OverflowError("integer overflow")
    return total


_ENV_LOCK = threading.Lock()
_ENV: dict[str, Any] = {}


def _env() -> Any:
    with _ENV_LOCK:
        if "env" not in _ENV:
            _ENV["env"] = cel.NewEnv(
                _POOL,
                variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
                functions=_declarations(),
                extensions=[ext_bindings.ExtBindings(), ext_optional.ExtOptional(), ext_strings.ExtStrings(2)],
            )
        return _ENV["env"]


_RELATIONAL = frozenset({"_<_", "_<=_", "_>_", "_>=_"})
_EQUALITY_VAR = "__tessera_left__"
def _is_device_map(n: Node) -> bool:
    return (isinstance(n, Select) and not n.optional and not n.test_only and n.field in ("attributes", "capacity")
            and getattr(n.operand, "name", None) == "device")


def _is_domain_lookup(n: Node) -> bool:
    """device.attributes[D] / device.capacity.D: always a map, so has() on it stays native."""
    return isinstance(n, Select | Index) and _is_device_map(n.operand)


def optional_equality(n: Call, left: Node, right: Node) -> Node:
    """cel-go's Optional.Equal: two empty optionals are equal, one empty one is not, and two values are
    compared with Go's Equal (a Semver or Quantity fails on another type), which cel-cpp does not do."""
    a, b = Ident(n.offset, f"__tessera_opt_a{n.offset}__"), Ident(n.offset, f"__tessera_opt_b{n.offset}__")
    a_set, b_set = Call(n.offset, "hasValue", (), a), Call(n.offset, "hasValue", (), b)
    values = (Call(n.offset, "dyn", (Call(n.offset, "value", (), a),)),
              Call(n.offset, "dyn", (Call(n.offset, "value", (), b),)))
    both = Call(n.offset, "_&&_", (a_set, b_set))
    compared = Call(n.offset, GO_EQUALS if n.function == "_==_" else GO_NOT_EQUALS, values)
    chosen = Call(n.offset, "_?_:_", (both, compared, Call(n.offset, n.function, (a_set, b_set))))
    cel = Ident(n.offset, "cel")
    return Call(n.offset, "bind", (a, left, Call(n.offset, "bind", (b, right, chosen), cel)), cel)


def rewrite_for_celexpr(ast: Node, analysis: Analysis | None = None) -> Node:
    """Bridge the places where cel-cpp and Kubernetes differ (module docstring).

    The analysis names the calls that need cel-go's semantics by offset: indexOf()/lastIndexOf()
    on lists (cel-cpp's strings extension owns those names), ==/!= with a left side whose type is
    only known at run time, and membership in a constant list.
    """
    return _CelexprRewrite(analysis).visit(ast)


class _CelexprRewrite:
    """One rewrite of a tree for cel-cpp; the analysis's offsets say which calls get cel-go's semantics."""

    def __init__(self, analysis: Analysis | None) -> None:
        self.list_index_calls = analysis.list_index_calls if analysis else frozenset()
        self.dynamic_equality_calls = analysis.dynamic_equality_calls if analysis else frozenset()
        self.message_equality_calls = analysis.message_equality_calls if analysis else frozenset()
        self.constant_membership_calls = analysis.constant_membership_calls if analysis else frozenset()
        self.optional_equality_calls = analysis.optional_equality_calls if analysis else frozenset()

    def visit(self, n: Node) -> Node:
        replaced = self.visit_call(n) if isinstance(n, Call) else self.visit_lookup(n)
        return replaced if replaced is not None else map_children(n, self.visit)

    @staticmethod
    def empty_domain(domain_map: Node, key: Node, offset: int) -> Node:
        # dyn(device.attributes[?key].orValue({})) -- an unknown domain reads as an empty map; dyn() keeps
        # the checker from typing the result as the literal's map(T, U)
        found = Index(offset, domain_map, key, optional=True)
        return Call(offset, "dyn", (Call(offset, "orValue", (MapLit(offset, ()),), found),))

    def visit_lookup(self, n: Node) -> Node | None:
        """A read of a device map by domain, or has() on an attribute value; None: neither."""
        if isinstance(n, Select) and _is_device_map(n.operand):
            key: Node = Literal(n.offset, "string", n.field)
            if n.test_only:
                return Literal(n.offset, "bool", True)  # has() on a domain: Find() always reports found
            if n.optional:
                return Call(n.offset, "optional.of", (self.empty_domain(n.operand, key, n.offset),))
            return self.empty_domain(n.operand, key, n.offset)
        if isinstance(n, Select) and n.test_only and not _is_domain_lookup(n.operand):
            # has() on an attribute value: cel-go answers false for a non-map, cel-cpp errors
            return Call(n.offset, HAS, (self.visit(n.operand), Literal(n.offset, "string", n.field)))
        if isinstance(n, Index) and _is_device_map(n.operand):
            key = self.visit(n.index)
            if n.optional:
                return Call(n.offset, "optional.of", (self.empty_domain(n.operand, key, n.offset),))
            return self.empty_domain(n.operand, key, n.offset)
        return None

    def visit_call(self, n: Call) -> Node | None:
        """A call that needs cel-go's semantics; None: it keeps cel-cpp's."""
        if n.function in ("_==_", "_!=_") and n.target is None and (
                n.offset in self.optional_equality_calls or n.offset in self.dynamic_equality_calls
                or n.offset in self.message_equality_calls):
            return self.equality(n)
        if n.target is not None and n.offset in self.list_index_calls and n.function in ("indexOf", "lastIndexOf"):
            name = LIST_INDEX_OF if n.function == "indexOf" else LIST_LAST_INDEX_OF
            return Call(n.offset, name, tuple(self.visit(a) for a in n.args), self.visit(n.target))
        if n.function == "@in" and n.offset in self.constant_membership_calls:
            return Call(n.offset, IN_CONSTANT_LIST, (self.visit(n.args[0]), n.args[1]))
        if n.function in ("value", "orValue") and n.target is not None:
            # cel-cpp infers the value of an optional on a dyn map from orValue()'s argument (or not at
            # all); cel-go types it as the map's values, so a comparison with another type compiles
            return Call(n.offset, "dyn", (map_children(n, self.visit),))
        if n.function in _RELATIONAL and n.target is None:
            left, right = (self.visit(a) for a in n.args)
            return Call(n.offset, n.function, (Call(n.offset, "dyn", (left,)), Call(n.offset, "dyn", (right,))))
        return None

    def equality(self, n: Call) -> Node:
        left, right = self.visit(n.args[0]), self.visit(n.args[1])
        if n.offset in self.optional_equality_calls:
            return optional_equality(n, left, right)
        # cel-go calls left.Equal(right): a Semver or Quantity on the left fails on any other type
        # (and a Quantity on an add()/sub() result), where cel-cpp would answer false
        go_function = GO_EQUALS if n.function == "_==_" else GO_NOT_EQUALS
        if n.offset in self.message_equality_calls:
            return Call(n.offset, go_function, (left, right))
        # only a message on the left needs Go's rules; other values keep cel-cpp's native equality
        value = Ident(n.offset, _EQUALITY_VAR)
        is_message = Call(n.offset, "@in", (Call(n.offset, "type", (value,)), ListLit(
            n.offset, (Ident(n.offset, "kubernetes.Semver"), Ident(n.offset, "kubernetes.Quantity")))))
        native = Call(n.offset, n.function, (value, right))
        chosen = Call(n.offset, "_?_:_", (is_message, Call(n.offset, go_function, (value, right)), native))
        return Call(n.offset, "bind", (value, left, chosen), Ident(n.offset, "cel"))


_ERROR_RE = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")
# handled by the rewrite (list_index_calls); the analysis already checked the overload
_LIST_INDEX = re.compile(r"found no matching overload for '(indexOf|lastIndexOf)' applied to '\(list")
_RECURSION = re.compile(r"recursion limit exceeded|max recursion depth", re.IGNORECASE)
_MIXED_NUMERIC = re.compile(r"found no matching overload for '_(<|<=|>|>=)_' applied to '\((int|uint|double), "
                            r"(int|uint|double)\)'")


def _compile_errors(err: Exception) -> list[tuple[int, int, str]]:
    found = [(int(m.group(1)), int(m.group(2)), m.group(3).strip()) for m in _ERROR_RE.finditer(str(err))]
    return found or [(1, 0, str(err).strip())]


# cel-cpp's RuntimeOptions.comprehension_max_iterations as cel-expr-python 0.1.3 sets it: an evaluation
# may run 9,999 comprehension iterations in all (nested loops count each inner iteration)
ITERATION_BUDGET = 10_000


class CelExprProgram:
    def __init__(self, expression: Any) -> None:
        self._expression = expression

    def evaluate(self, device: DeviceView) -> object:
        cached = device._cache.get("celexpr")
        if cached is None:
            cached = device._cache.setdefault("celexpr", _DeviceInput(device))
        assert isinstance(cached, _DeviceInput)
        _seen.table = dict(cached.quantities)
        try:
            result = self._expression.eval(cached.activation)
        except Exception as e:  # the binding raises for values it cannot convert, and on the budget
            if _ITERATION_BUDGET.search(str(e)):
                raise CelBudgetExceeded(f"evaluating it takes {ITERATION_BUDGET:,} or more comprehension iterations, "
                                        "cel-cpp's fixed budget per device") from None
            raise CelRuntimeError(str(e)) from e
        if result.type() == cel.Type.ERROR:
            raise CelRuntimeError(_runtime_message(str(result.value())))
        return _to_py(result.value())


_ITERATION_BUDGET = re.compile(r"Iteration budget exceeded")


def _runtime_message(text: str) -> str:
    text = re.sub(r"^[A-Z_]+: ", "", text)
    m = re.match(r'Key not found in map : "?(.*?)"?$', text)
    return f"no such key: {m.group(1)}" if m else text


class _DeviceInput:
    """A device converted once: its CEL data, its quantities, and one activation per thread.

    An activation owns an arena that evaluation allocates from, so threads do not share one.
    """

    def __init__(self, device: DeviceView) -> None:
        self.data = {"device": _device_data(device)}
        self._local = threading.local()
        self.quantities = {
            (m.numerator, m.denominator): q
            for caps in device.capacity.values()
            for q in caps.values()
            for m in (quantity_to_msg(q, remember=False),)
        }


    @property
    def activation(self) -> Any:
        activation = getattr(self._local, "activation", None)
        if activation is None:
            activation = _env().Activation(self.data)
            self._local.activation = activation
        return activation


def _device_data(device: DeviceView) -> Mapping[str, Any]:
    return {
        "driver": device.driver,
        "attributes": {d: {k: _to_cel(v) for k, v in attrs.items()} for d, attrs in device.attributes.items()},
        "capacity": {d: {k: quantity_to_msg(v, remember=False) for k, v in caps.items()}
                     for d, caps in device.capacity.items()},
        "allowMultipleAllocations": device.allow_multiple_allocations,
    }


class CelExprEngine:
    name = "celexpr"

    def compile(self, expression: str, ast: Node, analysis: Analysis) -> CelExprProgram:
        env = _env()
        expanded = expand_two_variable_macros(ast)
        original_error: tuple[int, int, str] | None = None
        if expanded == ast:
            # checked on the original text so that error columns point into what the user wrote
            try:
                env.compile(expression)
            except RuntimeError as e:
                real = [err for err in _compile_errors(e)
                        if not _MIXED_NUMERIC.search(err[2]) and not _LIST_INDEX.search(err[2])]
                if any(_RECURSION.search(err[2]) for err in real):
                    # redundant parentheses count towards cel-cpp's nesting limit of 32; the
                    # rewritten text below has only the ones precedence needs
                    real = []
                original_error = real[0] if real else None
        rewritten = unparse(rewrite_for_celexpr(expanded, analysis))
        try:
            compiled = env.compile(rewritten)
        except RuntimeError as e:
            if original_error is not None:
                line, column, message = original_error
                raise CelCompileError(expression, column, message, line=line) from None
            _, _, message = _compile_errors(e)[0]
            raise CelCompileError(expression, 0, message) from None
        # an error on the text as written that the rewrite bridges (mixed numeric comparisons, the values of
        # optionals on dyn maps, ...) is cel-cpp's typing, not cel-go's; tessera's own checks passed it
        return CelExprProgram(compiled)
