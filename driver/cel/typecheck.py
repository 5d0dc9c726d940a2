"""The selector type checker: one walk over the syntax tree that infers each node's static type and
records what the apiserver's checker would reject and what the engines need to know.

It records every attribute and capacity read (guarded or not, see driver.cel.guards), the checks the
apiserver performs at admission that an engine without a type checker (cel-python) cannot do (field
names on `device`, homogeneous literals, regex literals, known functions and obvious overload
mismatches), and the node types driver.cel.cost needs.
"""

from __future__ import annotations

from driver.cel.environment import STORED, CelEnvironment
from driver.cel.findings import AttributeRead, Issue, ReadKind
from driver.cel.guards import Fact, domain_map, flatten, presence_facts
from driver.cel.limits import MAX_DRIVER_SIZE, MAX_MAP_ENTRIES, MAX_STRING_SIZE
from driver.cel.signatures import (
    COMPARABLE,
    FUNCTIONS,
    MACROS_1VAR,
    MACROS_2VAR,
    NOT_INDEXABLE,
    NUMERIC,
    OPERATOR_RESULT,
    OPTIONAL_MACROS,
    REGEX_FUNCTIONS,
    TYPE_NAMES,
    UNCHECKED_FUNCTIONS,
)
from driver.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select, StructLit, children
from driver.cel.typemodel import (
    ATTRIBUTE_VALUE,
    BOOL,
    DECLARED_DYN,
    DEVICE_FIELDS,
    DYN,
    DYN_ATTRIBUTE_VALUE,
    DYN_CALL,
    INT,
    QUANTITY,
    TYPE_PARAM,
    UNBOUNDED,
    Scope,
    T,
    cel_type_name,
    compatible,
    is_concrete,
    literal_element_type,
)


class TypeChecker:
    def __init__(self, src: str, environment: CelEnvironment = STORED) -> None:
        self.src = src
        self.environment = environment
        self.reads: list[AttributeRead] = []
        self.issues: list[Issue] = []
        self.list_index_calls: set[int] = set()
        self.dynamic_equality_calls: set[int] = set()
        self.message_equality_calls: set[int] = set()
        self.constant_membership_calls: set[int] = set()
        self.optional_equality_calls: set[int] = set()
        self.parents: dict[int, Node] = {}
        self.types: dict[int, str] = {}
        self.elems: dict[int, str] = {}

    def column(self, offset: int) -> int:
        start = self.src.rfind("\n", 0, offset) + 1
        return offset - start + 1

    def issue(self, offset: int, message: str) -> None:
        self.issues.append(Issue(offset, message))

    # -- type inference with reads ---------------------------------------------------------------

    def visit(self, n: Node, scope: Scope, facts: frozenset[Fact]) -> T:
        """Returns the node's type and records reads, issues and the type (for driver.cel.cost)."""
        t = self._visit(n, scope, facts)
        self.types[id(n)] = "any" if t.domain == "attribute-value" else t.name
        if t.name == "list":
            self.elems[id(n)] = t.elem
        elif t.name == "optional" and t.value is not None:
            self.elems[id(n)] = cel_type_name(t.value)  # an optional of a scalar has a scalar's size
        return t

    def _visit(self, n: Node, scope: Scope, facts: frozenset[Fact]) -> T:
        for c in children(n):
            self.parents[id(c)] = n
        if isinstance(n, Literal):
            return self.literal_type(n)
        if isinstance(n, Ident):
            if n.name in scope.vars:
                return scope.vars[n.name]
            if n.name == "device":
                return T("device")
            if n.name in TYPE_NAMES:
                return T("type", 1)
            self.issue(n.offset, f"undeclared reference to '{n.name}'")
            return DYN
        if isinstance(n, Select):
            return self.visit_select(n, scope, facts)
        if isinstance(n, Index):
            return self.visit_index(n, scope, facts)
        if isinstance(n, ListLit):
            return self.visit_list(n, scope, facts)
        if isinstance(n, MapLit):
            return self.visit_map(n, scope, facts)
        if isinstance(n, StructLit):
            self.issue(n.offset, f"message literal '{n.type_name}' is not supported in device selectors")
            return DYN
        assert isinstance(n, Call)
        return self.visit_call(n, scope, facts)

    @staticmethod
    def literal_type(n: Literal) -> T:
        if n.kind in ("string", "bytes"):
            assert isinstance(n.value, str | bytes)
            return T(n.kind, len(n.value))
        return T(n.kind, 1)

    def record(self, kind: ReadKind, domain: str, name: str, *, offset: int, guarded: bool,
               facts: frozenset[Fact], node: Node) -> None:
        guarded = guarded or (kind, domain, name) in facts
        self.reads.append(AttributeRead(kind, domain, name, guarded, self.column(offset), self.expected_type(node)))

    def expected_type(self, node: Node) -> str | None:
        if getattr(node, "optional", False) or getattr(node, "test_only", False):
            return None
        parent = self.parents.get(id(node))
        if not isinstance(parent, Call):
            return None
        if parent.target is node and parent.function in FUNCTIONS:
            members = [o for o in FUNCTIONS[parent.function] if o[0]]
            kinds = {o[1][0] for o in members}
            if len(kinds) == 1:
                return kinds.pop()
            if parent.args and isinstance(parent.args[0], Call) and parent.args[0].function in ("quantity", "semver"):
                return parent.args[0].function
            return None
        if parent.function in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and len(parent.args) == 2:
            other = parent.args[1] if parent.args[0] is node else parent.args[0]
            if isinstance(other, Literal) and other.kind != "null":
                return other.kind
            if isinstance(other, Call) and other.target is None and other.function in ("quantity", "semver"):
                return other.function
        return None

    def visit_select(self, n: Select, scope: Scope, facts: frozenset[Fact]) -> T:
        base = self.visit(n.operand, scope, facts)
        result = self.member_of(base, n.field, n, literal=True, facts=facts, guarded=n.test_only or n.optional)
        if n.test_only:
            return BOOL
        if n.optional and result.name != "optional":
            return T("optional", 1, value=result)
        return result

    def visit_index(self, n: Index, scope: Scope, facts: frozenset[Fact]) -> T:
        base = self.visit(n.operand, scope, facts)
        key_t = self.visit(n.index, scope, facts)
        if base.name in ("device", "attrs", "attrmap", "caps", "capmap") and key_t.name not in ("string", "dyn"):
            self.issue(n.index.offset, f"found no matching overload for '_[_]' applied to '(map(string, ...), "
                                       f"{key_t.name})': keys of device maps are strings")
        if base.name in NOT_INDEXABLE:
            self.issue(n.offset, f"found no matching overload for '_[_]' applied to '({base.name}, {key_t.name})'")
            return DYN
        if isinstance(n.index, Literal) and isinstance(n.index.value, str):
            result = self.member_of(base, n.index.value, n, literal=True, facts=facts, guarded=n.optional)
        else:
            dynamic_guard = n.optional or (isinstance(n.index, Ident) and scope.vars.get(n.index.name, DYN).domain
                                           == f"key-of:{base.name}:{base.domain}")
            result = self.member_of(base, "*", n, literal=False, facts=facts, guarded=dynamic_guard)
            if base.name == "list" and key_t.name not in ("int", "uint", "dyn", "double"):
                self.issue(n.index.offset, f"found no matching overload for '_[_]' applied to '(list, {key_t.name})'")
        return T("optional", 1, value=result) if n.optional and result.name != "optional" else result

    def member_of(self, base: T, name: str, node: Node, *, literal: bool, facts: frozenset[Fact],
                  guarded: bool) -> T:
        offset = node.offset
        if base.name == "device":
            if not literal:
                return DYN
            if name not in DEVICE_FIELDS:
                self.issue(offset, f"undefined field '{name}' (device has {', '.join(DEVICE_FIELDS)})")
                return DYN
            if name == "allowMultipleAllocations" and not self.environment.declares_allow_multiple_allocations:
                self.issue(offset, "undefined field 'allowMultipleAllocations': a new selector may read it only "
                                   "while the DRAConsumableCapacity feature gate is on")
                return DYN
            return {"driver": T("string", MAX_DRIVER_SIZE), "attributes": T("attrs", MAX_MAP_ENTRIES),
                    "capacity": T("caps", MAX_MAP_ENTRIES), "allowMultipleAllocations": BOOL}[name]
        if base.name in ("attrs", "caps"):
            return T("attrmap" if base.name == "attrs" else "capmap", MAX_MAP_ENTRIES, domain=name)
        if base.name in ("attrmap", "capmap"):
            kind: ReadKind = "attribute" if base.name == "attrmap" else "capacity"
            self.record(kind, base.domain or "*", name, offset=offset, guarded=guarded, facts=facts, node=node)
            if kind == "capacity":
                return QUANTITY
            return DYN_ATTRIBUTE_VALUE if self.environment.dyn_attributes else ATTRIBUTE_VALUE
        if base.name in ("map", "dyn"):
            return DYN
        if base.name == "optional":
            # selecting through an optional stays optional (cel-go's optional field chaining)
            if base.value is None:
                return T("optional")
            inner = self.member_of(base.value, name, node, literal=literal, facts=facts, guarded=True)
            return inner if inner.name == "optional" else T("optional", 1, value=inner)
        if base.name == "list" and not literal:
            return T(base.elem, MAX_STRING_SIZE) if base.elem != "dyn" else DYN
        if literal and base.name not in ("dyn", "map"):
            self.issue(offset, f"type '{base.name}' does not support field selection")
        return DYN

    def visit_list(self, n: ListLit, scope: Scope, facts: frozenset[Fact]) -> T:
        elem_types: set[str] = set()
        for i, e in enumerate(n.elements):
            t = self.visit(e, scope, facts)
            elem_types.add("optional-elem" if (n.optional and n.optional[i]) else literal_element_type(t))
        concrete = {t for t in elem_types if t not in ("dyn", "optional-elem")}
        if len(concrete) > 1:
            first, second = (name.rstrip("!") for name in sorted(concrete)[:2])
            self.issue(n.offset, f"expected type '{first}' but found '{second}': list literals must be homogeneous")
        elem = concrete.pop() if len(concrete) == 1 and "dyn" not in elem_types else "dyn"
        elem = "dyn" if elem in ("any", DECLARED_DYN) else elem
        return T("list", len(n.elements), elem=elem)

    def visit_map(self, n: MapLit, scope: Scope, facts: frozenset[Fact]) -> T:
        key_types: set[str] = set()
        value_types: set[str] = set()
        for e in n.entries:
            kt = self.visit(e.key, scope, facts)
            vt = self.visit(e.value, scope, facts)
            key_types.add(literal_element_type(kt))
            value_types.add(literal_element_type(vt))
        for kinds, what in ((key_types, "keys"), (value_types, "values")):
            concrete = sorted(t for t in kinds if t not in ("dyn", "optional"))
            if len(concrete) > 1:
                first, second = (name.rstrip("!") for name in concrete[:2])
                self.issue(n.offset, f"expected type '{first}' but found '{second}': map literal {what} must be "
                                     "homogeneous")
        return T("map", len(n.entries))

    # -- calls ------------------------------------------------------------------------------------

    def visit_call(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> T:
        fn = n.function
        if fn in ("_&&_", "_||_"):
            return self.visit_logic(n, scope, facts)
        if fn == "_?_:_":
            cond, then, other = n.args
            ct = self.visit(cond, scope, facts)
            self.expect_bool(cond, ct, "_?_:_")
            pos, neg = presence_facts(cond, scope)
            tt = self.visit(then, scope, facts | pos)
            ot = self.visit(other, scope, facts | neg)
            same = cel_type_name(tt) == cel_type_name(ot)
            return tt if same else DYN
        if n.target is not None and isinstance(n.target, Ident) and n.target.name == "cel" and fn == "bind":
            return self.visit_bind(n, scope, facts)
        if n.target is not None and fn in (MACROS_1VAR | MACROS_2VAR) and n.args and isinstance(n.args[0], Ident):
            macro = self.visit_macro(n, scope, facts)
            if macro is not None:
                return macro
        if fn in OPTIONAL_MACROS and n.target is not None and len(n.args) == 2 and isinstance(n.args[0], Ident):
            return self.visit_optional_macro(n, scope, facts)
        qualified = _qualified_name(n)
        if qualified is not None:
            n = Call(n.offset, qualified, n.args, None)
            fn = qualified
        target_t = self.visit(n.target, scope, facts) if n.target is not None else None
        arg_types = [self.visit(a, scope, facts) for a in n.args]
        if fn in REGEX_FUNCTIONS:
            self.check_regex(n)
        if fn == "@in" and len(n.args) == 2:
            self.record_membership_test(n, scope, facts)
            container = n.args[1]
            if isinstance(container, ListLit) and all(isinstance(e, Literal) for e in container.elements) and (
                    cel_type_name(arg_types[0]) in ("dyn", "semver")):
                self.constant_membership_calls.add(n.offset)
        return self.resolve(n, target_t, arg_types)

    def record_membership_test(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> None:
        """`"name" in device.attributes["d"]` reads the attribute's presence: a guarded read."""
        key, container = n.args
        dm = domain_map(container, scope)
        if dm is None:
            t = scope.vars.get(container.name) if isinstance(container, Ident) else None
            if t is None or t.name not in ("attrmap", "capmap"):
                return
            dm = ("attribute" if t.name == "attrmap" else "capacity", t.domain or "*")
        kind: ReadKind = "attribute" if dm[0] == "attribute" else "capacity"
        name = key.value if isinstance(key, Literal) and isinstance(key.value, str) else "*"
        self.record(kind, dm[1], name, offset=key.offset, guarded=True, facts=facts, node=key)

    def expect_bool(self, node: Node, t: T, fn: str) -> None:
        if t.name not in ("bool", "dyn"):
            self.issue(node.offset, f"found no matching overload for '{fn}' applied to '({t.name})': expected bool")

    def visit_logic(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> T:
        operands = list(flatten(n, n.function))
        side = 0 if n.function == "_&&_" else 1
        provided = [presence_facts(op, scope)[side] for op in operands]
        for i, op in enumerate(operands):
            others = frozenset().union(*(p for j, p in enumerate(provided) if j != i))
            t = self.visit(op, scope, facts | others)
            self.expect_bool(op, t, n.function)
        return BOOL

    def visit_bind(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> T:
        if len(n.args) != 3 or not isinstance(n.args[0], Ident):
            self.issue(n.offset, "cel.bind() takes an identifier, an initializer and an expression")
            return DYN
        init_t = self.visit(n.args[1], scope, facts)
        return self.visit(n.args[2], scope.child(**{n.args[0].name: init_t}), facts)

    def visit_macro(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> T | None:
        fn = n.function
        three_args = len(n.args) == 3 and isinstance(n.args[1], Ident)
        if fn in ("transformList", "transformMap", "transformMapEntry") or (
                fn in ("all", "exists", "existsOne") and three_args):
            two_var = True
        elif fn in MACROS_1VAR and len(n.args) in (2, 3):
            two_var = False
        else:
            return None
        assert n.target is not None
        range_t = self.visit(n.target, scope, facts)
        if range_t.domain == "attribute-value":
            # attribute values are typed google.protobuf.Any while DRAListTypeAttributes is off
            self.issue(n.target.offset, "expression of type 'any' cannot be range of a comprehension (must be "
                                        "list, map, or dynamic)")
        elif range_t.name not in ("list", "map", "dyn", "attrs", "attrmap", "caps", "capmap", "device"):
            self.issue(n.target.offset, f"expression of type '{range_t.name}' cannot be the range of a "
                                        "comprehension (must be list, map, or dynamic)")
        size = min(range_t.size, UNBOUNDED)
        is_map = range_t.name in ("map", "attrs", "attrmap", "caps", "capmap", "device")
        # the iteration variable: keys for maps, elements for lists
        key_t = T("string", MAX_STRING_SIZE, domain=f"key-of:{range_t.name}:{range_t.domain}") if is_map else (
            T(range_t.elem, MAX_STRING_SIZE) if range_t.elem != "dyn" else DYN)
        names = [a.name for a in n.args if isinstance(a, Ident)]
        bindings: dict[str, T] = {}
        if two_var and len(names) >= 2:
            bindings[names[0]] = key_t if is_map else INT
            value_t = self.member_value_type(range_t) if is_map else key_t
            bindings[names[1]] = value_t
            body_args = n.args[2:]
        elif not two_var and len(n.args) in (2, 3) and names:
            bindings[names[0]] = key_t
            body_args = n.args[1:]
        else:
            return None
        inner = scope.child(**bindings)
        body_types = [self.visit(b, inner, facts) for b in body_args]
        if fn in ("all", "exists", "exists_one", "existsOne"):
            self.expect_bool(body_args[0], body_types[0], fn)
            return BOOL
        if fn == "filter":
            return T("list", size, elem=range_t.elem)
        if fn in ("map", "transformList"):
            return T("list", size, elem=cel_type_name(body_types[-1]))
        return T("list" if fn == "sortBy" else "map", size)

    def visit_optional_macro(self, n: Call, scope: Scope, facts: frozenset[Fact]) -> T:
        """opt.optMap(v, f) and opt.optFlatMap(v, f): f with v bound to the optional's value."""
        assert n.target is not None and isinstance(n.args[0], Ident)
        target_t = self.visit(n.target, scope, facts)
        if target_t.name not in ("optional", "dyn"):
            self.issue(n.offset, f"found no matching overload for 'hasValue' applied to '{cel_type_name(target_t)}.()'")
        value_t = target_t.value or DYN
        body_t = self.visit(n.args[1], scope.child(**{n.args[0].name: value_t}), facts)
        if n.function == "optMap":
            return T("optional", 1, value=body_t)
        if body_t.name not in ("optional", "dyn"):
            self.issue(n.args[1].offset, f"optFlatMap() must return an optional, not {cel_type_name(body_t)}")
        return body_t if body_t.name == "optional" else T("optional")

    @staticmethod
    def member_value_type(range_t: T) -> T:
        if range_t.name == "attrs":
            return T("attrmap", MAX_MAP_ENTRIES, domain="*")
        if range_t.name == "caps":
            return T("capmap", MAX_MAP_ENTRIES, domain="*")
        if range_t.name == "capmap":
            return QUANTITY
        return DYN

    def check_regex(self, n: Call) -> None:
        pattern_node = n.args[-1] if n.target is None and n.function == "matches" else (n.args[0] if n.args else None)
        if isinstance(pattern_node, Literal) and isinstance(pattern_node.value, str):
            error = regex_error(pattern_node.value)
            if error:
                self.issue(pattern_node.offset, error)

    def resolve(self, n: Call, target_t: T | None, arg_types: list[T]) -> T:
        fn = n.function
        if fn.startswith(("_", "@", "!", "-")) and fn in OPERATOR_RESULT:
            return self.resolve_operator(n, arg_types)
        if fn == "_[_]":
            return DYN
        receiver = (cel_type_name(target_t),) if target_t is not None else ()
        shapes = receiver + tuple(cel_type_name(t) for t in arg_types)
        overloads = FUNCTIONS.get(fn)
        if fn == "includes" and not self.environment.declares_includes:
            self.issue(n.offset, "undeclared reference to 'includes': a new selector may call it only while the "
                                 "DRAListTypeAttributes feature gate is on")
            return DYN
        if overloads is None:
            if fn in UNCHECKED_FUNCTIONS or fn in MACROS_1VAR | MACROS_2VAR:
                return DYN
            self.issue(n.offset, f"undeclared reference to '{fn}'")
            return DYN
        member = target_t is not None
        style_match = [o for o in overloads if o[0] == member and len(o[1]) == len(shapes)]
        matching = [o for o in style_match if all(compatible(a, e) for a, e in zip(shapes, o[1], strict=True))]
        if not matching:
            applied = ", ".join(shapes)
            where = f"'{applied}'" if not member else f"'{shapes[0]}.({', '.join(shapes[1:])})'"
            self.issue(n.offset, f"found no matching overload for '{fn}' applied to {where}")
            return DYN
        if fn in ("indexOf", "lastIndexOf") and shapes[0] == "list":
            self.list_index_calls.add(n.offset)
        special = self.resolve_optional(n, target_t, arg_types) or (DYN_CALL if fn == "dyn" else None)
        if special is not None:
            return special
        results = {o[2] for o in matching}
        result = T(results.pop()) if len(results) == 1 else DYN
        if result.name == "list" and fn in ("split", "findAll") and target_t is not None:
            result = T("list", min(target_t.size, MAX_STRING_SIZE * 4), elem="string")
        if result.name == "string" and target_t is not None:
            result = T("string", target_t.size)
        if fn == "lists.range" and isinstance(n.args[0], Literal) and isinstance(n.args[0].value, int):
            result = T("list", max(n.args[0].value, 0), elem="int")
        return result

    def resolve_optional(self, n: Call, target_t: T | None, arg_types: list[T]) -> T | None:
        """The optional library's result types (None for other functions); a value orValue()/or() cannot
        take is an error."""
        unassignable = _optional_argument_mismatch(n.function, target_t, arg_types)
        if unassignable:
            self.issue(n.offset, f"found no matching overload for '{n.function}' applied to '{unassignable}'")
            return DYN
        return _optional_result(n.function, target_t, arg_types)

    def resolve_operator(self, n: Call, arg_types: list[T]) -> T:
        fn = n.function
        shapes = [cel_type_name(t) for t in arg_types]
        if fn in ("_==_", "_!=_"):
            self.bind_type_parameters(n, arg_types)
            self.note_equality(n.offset, shapes)
            if shapes == ["optional", "optional"]:
                self.optional_equality_calls.add(n.offset)
            mismatch = _optional_mismatch(arg_types)
            if mismatch:
                self.issue(n.offset, f"found no matching overload for '{fn}' applied to '({mismatch})'")
                return DYN
        bad = _operator_rejects(fn, shapes)
        if fn == "@in" and not bad and self.rejects_mixed_membership(n, arg_types):
            return DYN
        if bad:
            self.issue(n.offset, f"found no matching overload for '{fn}' applied to '({', '.join(shapes)})'")
            return DYN
        result = OPERATOR_RESULT[fn]
        if result == "same":
            first = next((t for t in arg_types if t.name != "dyn"), DYN)
            if fn == "_+_" and first.name in ("string", "list"):
                return T(first.name, sum(min(t.size, UNBOUNDED) for t in arg_types), elem=first.elem)
            return T(cel_type_name(first))
        return T(result, 1)

    def bind_type_parameters(self, n: Call, arg_types: list[T]) -> None:
        """`optional.none().value() == semver("1.0.0")`: the checker binds the free type to the other side's,
        which the cost estimate then sees (a Semver equality is O(1))."""
        for i, t in enumerate(arg_types):
            other = arg_types[1 - i]
            if t.domain == "type-param" and other.domain != "type-param":
                self.types[id(n.args[i])] = "any" if other.domain == "attribute-value" else other.name

    def note_equality(self, offset: int, shapes: list[str]) -> None:
        """Records the ==/!= calls the engines must evaluate the way Go does (see engine_celexpr)."""
        # a Quantity on the left is compared by Go's Quantity.Equal, which rejects an add()/sub() result
        if shapes[0] == "quantity" or (shapes[0] == "semver" and shapes[1] == "dyn"):
            self.message_equality_calls.add(offset)
        elif shapes[0] == "dyn" and shapes[1] != "null":
            self.dynamic_equality_calls.add(offset)

    def rejects_mixed_membership(self, n: Call, arg_types: list[T]) -> bool:
        """`in` has no cross-type overloads: 0 in ["a"] does not compile."""
        element = arg_types[1].elem if cel_type_name(arg_types[1]) == "list" else "dyn"
        left = literal_element_type(arg_types[0])
        if element not in ("dyn", left) and left not in ("dyn", "any", DECLARED_DYN):
            self.issue(n.offset, f"found no matching overload for '@in' applied to '({left}, list({element}))'")
            return True
        return False


def _optional_mismatch(arg_types: list[T]) -> str:
    """"optional_type(int), optional_type(bool)" when two optionals hold different known types, else ""."""
    if len(arg_types) != 2 or any(t.name != "optional" or t.value is None for t in arg_types):
        return ""
    inner = [literal_element_type(t.value) for t in arg_types if t.value is not None]
    if {"dyn", "any", DECLARED_DYN} & set(inner) or inner[0] == inner[1]:
        return ""
    return ", ".join(f"optional_type({name.rstrip('!')})" for name in inner)


def _optional_argument_mismatch(fn: str, target_t: T | None, arg_types: list[T]) -> str:
    """"optional_type(string).(int)" when orValue()/or() is given a value of another known type, else ""."""
    if fn not in ("orValue", "or") or target_t is None or target_t.name != "optional" or len(arg_types) != 1:
        return ""
    held, given = target_t.value, arg_types[0]
    if fn == "or":
        if given.name != "optional":
            return ""
        given = given.value or DYN
    if held is None or not is_concrete(held) or held.domain == "type-param" or not is_concrete(given) or (
            given.domain == "type-param"):
        return ""
    want, got = literal_element_type(held), literal_element_type(given)
    if want == got:
        return ""
    got_text = f"optional_type({got})" if fn == "or" else got
    return f"optional_type({want}).({got_text})"


def _optional_result(fn: str, target_t: T | None, arg_types: list[T]) -> T | None:
    """The result type of the optional library's functions: optional(V) carries V through."""
    if fn in ("optional.of", "optional.ofNonZeroValue") and arg_types:
        return T("optional", 1, value=arg_types[0])
    if fn == "optional.none":
        return T("optional", 1, value=TYPE_PARAM)
    if target_t is None:
        return None
    if fn in ("value", "orValue") and target_t.name == "optional":
        if fn == "orValue" and arg_types and (target_t.value is None or target_t.value.domain == "type-param"):
            return arg_types[0]  # optional.none().orValue(V) is a V
        return target_t.value or DYN
    if fn == "or" and target_t.name == "optional":
        return target_t if target_t.value is not None else (arg_types[0] if arg_types else T("optional"))
    if fn in ("first", "last") and target_t.name == "list":
        return T("optional", 1, value=DYN if target_t.elem == "dyn" else T(target_t.elem, MAX_STRING_SIZE))
    return None


def _operator_rejects(fn: str, shapes: list[str]) -> bool:
    """Whether no overload of operator fn accepts operands of these types (dyn accepts anything)."""
    known = [s for s in shapes if s != "dyn"]
    mixed = len(known) == 2 and known[0] != known[1]
    if fn in ("_==_", "_!=_"):
        return mixed and "null" not in known
    if fn in ("_<_", "_<=_", "_>_", "_>=_"):
        return any(s not in COMPARABLE for s in known) or (
            mixed and not (known[0] in NUMERIC and known[1] in NUMERIC))
    if fn == "_+_":
        return any(s not in (*NUMERIC, "string", "bytes", "list", "timestamp", "duration") for s in known) or (
            mixed and {known[0], known[1]} != {"timestamp", "duration"})
    if fn in ("_-_", "_*_", "_/_", "_%_"):
        allowed = NUMERIC if fn != "_-_" else (*NUMERIC, "timestamp", "duration")
        return any(s not in allowed for s in known) or (mixed and fn != "_-_")
    if fn == "!_":
        return bool(known) and known[0] != "bool"
    if fn == "-_":
        return bool(known) and known[0] not in ("int", "double", "duration")
    if fn == "@in":
        return len(shapes) == 2 and shapes[1] not in ("list", "map", "dyn")
    return False


def _qualified_name(n: Call) -> str | None:
    """`strings.quote(x)`, `sets.contains(a, b)`, `optional.of(x)`, `lists.range(n)` parse as member calls."""
    if isinstance(n.target, Ident) and n.target.name in ("strings", "sets", "optional", "lists", "format", "ip"):
        name = f"{n.target.name}.{n.function}"
        if name in FUNCTIONS or name in UNCHECKED_FUNCTIONS:
            return name
    return None


def regex_error(pattern: str) -> str:
    """RE2 syntax check, as cel-go's regex literal validator does at compile time ("" if valid)."""
    from driver.cel.library import compiled_regex

    try:
        compiled_regex(pattern)
    except ValueError as e:
        return str(e)
    return ""
