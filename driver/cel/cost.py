"""The worst-case cost of a selector, computed the way the apiserver does before it admits one.

Kubernetes rejects a DRA selector whose estimated cost exceeds 1,000,000. The estimate is cel-go's
checker.Cost with Kubernetes' library estimator and the DRA size estimator on top; this module
follows the same rules over tessera's syntax tree, with the static types from driver.cel.typecheck:

- sizes are (min, max) ranges: literals are exact, the `device` fields have the maximum sizes the
  DRA environment declares (driver 63, attribute values 64, 32 entries per map), anything else
  unknown is 0..2^64-1, and all arithmetic saturates at 2^64-1 as Go's does;
- size-dependent functions cost by size: string and bytes `+` by the size of the result (so a
  `cel.bind` chain that doubles a string is charged for every doubling), `==`/`<` on strings by the
  smaller operand, `contains`/`matches`/`find` by the product of the two sizes, `in` by the list
  size, lowerAscii/replace/split/join/... as Kubernetes' library charges them, and list helpers
  (lists.range, sort, distinct, sets.*) as cel-go's extensions do;
- macros are charged as their expansion: the range, the accumulator, and per element the loop
  condition plus step (e.g. `map` appends to a list: 12 + the mapped expression per element).

Only the maximum is returned (the apiserver compares the maximum). tests/driver/cel/cost_corpus.json holds
the cases checked against the Go oracle (e2e/test_oracles.py), and tests/driver/cel/test_cost.py the same
numbers without Go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from driver.cel.limits import MAX_LIST_ATTRIBUTE_VALUES
from driver.cel.sizes import (
    U64,
    UNKNOWN,
    Entry,
    Size,
    add,
    declared_size,
    factor,
    mul,
    replaced_size,
    size_add,
    size_mul,
    union,
)
from driver.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select, StructLit

STRING_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIST_CREATE = 10
MAP_CREATE = 30
STRUCT_CREATE = 40


SCALARS = frozenset({"bool", "int", "uint", "double", "duration", "timestamp"})
MAP_KINDS = frozenset({"map", "attrs", "attrmap", "caps", "capmap"})
STRUCT_KINDS = frozenset({"device", "quantity", "semver"})


@dataclass
class _Local:
    path: tuple[str, ...]
    size: Size | None
    entry: Entry | None


class Coster:
    """One estimate. `types` maps id(node) to the analysis' type name for that node ("dyn" unknown,
    "any" for attribute values) and its element type for lists ("list:string")."""

    def __init__(self, types: dict[int, str], elems: dict[int, str]) -> None:
        self.types = types
        self.elems = elems
        self.sizes: dict[int, Size] = {}
        self.entries: dict[int, Entry] = {}
        self.paths: dict[int, tuple[str, ...]] = {}
        self.scopes: dict[str, list[_Local]] = {}

    # -- bookkeeping -------------------------------------------------------------------------------

    def kind(self, n: Node) -> str:
        return self.types.get(id(n), "dyn")

    def path(self, n: Node) -> tuple[str, ...]:
        if isinstance(n, Ident) and self.scopes.get(n.name):
            return self.scopes[n.name][-1].path
        return self.paths.get(id(n), ())

    def size(self, n: Node) -> Size | None:
        if id(n) in self.sizes:
            return self.sizes[id(n)]
        if isinstance(n, Literal):
            if n.kind in ("string", "bytes"):
                assert isinstance(n.value, str | bytes)
                return (len(n.value), len(n.value))
            return (1, 1)
        if isinstance(n, ListLit):
            return (len(n.elements), len(n.elements))
        if isinstance(n, MapLit):
            return (len(n.entries), len(n.entries))
        declared = declared_size(self.path(n))
        if declared is not None:
            return declared
        if self.kind(n) in SCALARS or (self.kind(n) == "optional" and self.elems.get(id(n)) in SCALARS):
            return (1, 1)
        if isinstance(n, Ident) and self.scopes.get(n.name):
            return self.scopes[n.name][-1].size
        return None

    def size_or_unknown(self, n: Node) -> Size:
        found = self.size(n)
        return found if found is not None else UNKNOWN

    def entry(self, n: Node) -> Entry | None:
        if id(n) in self.entries:
            return self.entries[id(n)]
        if isinstance(n, Ident) and self.scopes.get(n.name):
            return self.scopes[n.name][-1].entry
        return None

    def push(self, name: str, local: _Local) -> None:
        self.scopes.setdefault(name, []).append(local)

    def pop(self, name: str) -> None:
        self.scopes[name].pop()

    def push_local(self, name: str, init: Node) -> None:
        self.push(name, _Local(self.path(init), self.size(init), self.entry(init)))

    def push_iteration(self, names: list[str], range_node: Node) -> None:
        """The iteration variables of a comprehension over `range_node` (one, or key and value)."""
        entry = self.entry(range_node)
        container = entry.kind if entry else ("list" if self.kind(range_node) == "list" else "map")
        base = self.path(range_node)
        if len(names) == 1:
            if container == "list":
                self.push(names[0], _Local((*base, "@items"), entry.val if entry else None, None))
            else:
                self.push(names[0], _Local((*base, "@keys"), entry.key if entry else None, None))
            return
        key_path = "@indices" if container == "list" else "@keys"
        value_path = "@items" if container == "list" else "@values"
        self.push(names[0], _Local((*base, key_path), entry.key if entry else None, None))
        self.push(names[1], _Local((*base, value_path), entry.val if entry else None, None))

    # -- cost --------------------------------------------------------------------------------------

    def cost(self, n: Node) -> int:
        if isinstance(n, Literal):
            return 0
        if isinstance(n, Ident):
            if not self.scopes.get(n.name):
                self.paths[id(n)] = (n.name,)
            return 1
        if isinstance(n, Select):
            return self.cost_select(n)
        if isinstance(n, Index):
            return self.cost_index(n)
        if isinstance(n, ListLit):
            total = LIST_CREATE
            val: Size = (U64, 0) if n.elements else (0, 0)
            for e in n.elements:
                total = add(total, self.cost(e))
                val = union(val, self.size_or_unknown(e))
            self.entries[id(n)] = Entry("list", (1, 1), val)
            return total
        if isinstance(n, MapLit):
            total = MAP_CREATE
            key: Size = (U64, 0) if n.entries else (0, 0)
            val = key
            for entry in n.entries:
                total = add(total, add(self.cost(entry.key), self.cost(entry.value)))
                key = union(key, self.size_or_unknown(entry.key))
                val = union(val, self.size_or_unknown(entry.value))
            self.entries[id(n)] = Entry("map", key, val)
            return total
        if isinstance(n, StructLit):
            total = STRUCT_CREATE
            for _, value, _ in n.fields:
                total = add(total, self.cost(value))
            return total
        assert isinstance(n, Call)
        return self.cost_call(n)

    def cost_select(self, n: Select) -> int:
        if n.test_only:
            return self.cost(n.operand)  # Kubernetes keeps has() free (PresenceTestHasCost(false))
        if n.optional:
            return add(self.cost(n.operand), 1)  # _?._(operand, "field"): an O(1) call
        total = self.cost(n.operand)
        if self.kind(n.operand) in MAP_KINDS or self.kind(n.operand) in STRUCT_KINDS:
            total = add(total, 1)
        self.paths[id(n)] = (*self.path(n.operand), n.field)
        return total

    def cost_index(self, n: Index) -> int:
        total = add(add(self.cost(n.operand), self.cost(n.index)), 1)
        if n.optional:
            return total
        entry = self.entry(n.operand)
        if self.kind(n.operand) == "list":
            self.paths[id(n)] = (*self.path(n.operand), "@items")
        else:
            self.paths[id(n)] = (*self.path(n.operand), "@values")
        if entry is not None:
            self.sizes[id(n)] = entry.val
        return total

    def cost_call(self, n: Call) -> int:
        fn = n.function
        if fn == "dyn" and n.target is None and len(n.args) == 1:
            total = add(1, self.cost(n.args[0]))
            self.copy_sizes(n, n.args[0])
            return total
        if fn == "bind" and isinstance(n.target, Ident) and n.target.name == "cel" and len(n.args) == 3 and isinstance(
                n.args[0], Ident):
            total = add(LIST_CREATE, self.cost(n.args[1]))
            self.push_local(n.args[0].name, n.args[1])
            total = add(total, self.cost(n.args[2]))
            self.pop(n.args[0].name)
            self.copy_sizes(n, n.args[2])
            return total
        macro = self.cost_macro(n)
        if macro is not None:
            return macro
        if fn in ("optMap", "optFlatMap") and n.target is not None and len(n.args) == 2 and isinstance(
                n.args[0], Ident):
            return self.cost_optional_macro(n, n.target, n.args[0].name, n.args[1])
        if fn in ("_&&_", "_||_"):
            return add(self.cost(n.args[0]), self.cost(n.args[1]))
        if fn == "_?_:_":
            cond, then, other = (self.cost(a) for a in n.args)
            self.sizes[id(n)] = union(self.size_or_unknown(n.args[1]), self.size_or_unknown(n.args[2]))
            then_entry = self.entry(n.args[1])
            if then_entry is not None:
                merged = then_entry.union(self.entry(n.args[2]))
                if merged is not None:
                    self.entries[id(n)] = merged
            return add(cond, max(then, other))
        total = self.cost(n.target) if n.target is not None and not _is_namespace(n) else 0
        for a in n.args:
            total = add(total, self.cost(a))
        return add(total, self.function_cost(n))

    def copy_sizes(self, dst: Node, src: Node) -> None:
        found = self.size(src)
        if found is not None:
            self.sizes[id(dst)] = found
        entry = self.entry(src)
        if entry is not None:
            self.entries[id(dst)] = entry

    # -- macros -------------------------------------------------------------------------------------

    def cost_macro(self, n: Call) -> int | None:
        fn, target = n.function, n.target
        if target is None or not n.args or not isinstance(n.args[0], Ident) or _is_namespace(n):
            return None
        two_vars = len(n.args) >= 3 and isinstance(n.args[1], Ident) and fn in (
            "all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry")
        if fn in ("transformList", "transformMap", "transformMapEntry") and not two_vars:
            return None
        if not two_vars and (fn not in ("all", "exists", "exists_one", "existsOne", "map", "filter", "sortBy")
                             or len(n.args) not in (2, 3)):
            return None
        names = [a.name for a in n.args[: 2 if two_vars else 1] if isinstance(a, Ident)]
        body = n.args[len(names):]
        if fn == "sortBy":
            return self.cost_sort_by(n, names[0], body[0])
        range_cost = self.cost(target)
        range_size = self.size_or_unknown(target)
        self.push_iteration(names, target)
        element = self.scopes[names[-1]][-1].size or UNKNOWN
        body_costs = [self.cost(b) for b in body]
        body_sizes = [self.size_or_unknown(b) for b in body]
        for name in names:
            self.pop(name)
        if fn in ("all", "exists"):
            # accu && p (or accu || p) per element, behind @not_strictly_false(accu) (or (!accu))
            per, init, result = body_costs[0] + (3 if fn == "all" else 4), 0, 1
        elif fn in ("exists_one", "existsOne"):
            per, init, result = body_costs[0] + 2, 0, 2  # p ? accu + 1 : accu; accu == 1
        elif fn == "filter":
            per, init, result = body_costs[0] + 13, LIST_CREATE, 1  # p ? accu + [x] : accu
            self.entries[id(n)] = Entry("list", (1, 1), (0, element[1]))
        elif fn in ("map", "transformList"):
            mapped = body_costs[-1] + 12  # accu + [f]
            per = add(body_costs[0], mapped) if len(body) == 2 else mapped
            init, result = LIST_CREATE, 1
            self.entries[id(n)] = Entry("list", (1, 1), (0, body_sizes[-1][1]))
        else:  # transformMap, transformMapEntry: cel.@mapInsert(accu, k, f) / (accu, f)
            inserted = body_costs[-1] + (3 if fn == "transformMap" else 2)
            per = add(body_costs[0], inserted) if len(body) == 2 else inserted
            init, result = MAP_CREATE, 1
        total = add(add(add(range_cost, init), result), mul(range_size[1], per))
        if init:
            self.sizes[id(n)] = range_size
        else:
            self.sizes[id(n)] = (1, 1)
        return total

    def cost_optional_macro(self, n: Call, target: Node, name: str, body: Node) -> int:
        """opt.optMap(v, f) is charged as cel-go expands it: opt.hasValue() ? optional.of(<bind v to
        opt.value() in f>) : optional.none(), the target counted in both places; optFlatMap has no
        optional.of. The bound value's size is unknown (value() has no path)."""
        condition = add(self.cost(target), 1)
        bound = add(LIST_CREATE, add(self.cost(target), 1))
        self.push(name, _Local((), None, None))
        mapped = add(bound, self.cost(body))
        self.pop(name)
        if n.function == "optMap":
            mapped = add(mapped, 1)
        return add(condition, max(mapped, 1))

    def cost_sort_by(self, n: Call, name: str, key: Node) -> int:
        # cel.bind(in, target, in.@sortByAssociatedKeys(in.map(name, key)))
        assert n.target is not None
        total = add(LIST_CREATE, self.cost(n.target))
        size = self.size_or_unknown(n.target)
        self.push(name, _Local((*self.path(n.target), "@items"),
                               self.entry(n.target).val if self.entry(n.target) else None, None))  # type: ignore[union-attr]
        mapped = self.cost(key)
        self.pop(name)
        mapping = add(add(add(1, LIST_CREATE), 1), mul(size[1], mapped + 12))
        sort = add(add(factor(size_mul(size, size)[1], 2.0), 1), LIST_CREATE)
        self.sizes[id(n)] = size
        return add(add(total, 1), add(mapping, sort))

    # -- functions ----------------------------------------------------------------------------------

    def function_cost(self, n: Call) -> int:
        """The call's own cost (its arguments and target are already counted); sets the result size."""
        fn = n.function
        target = n.target if n.target is not None and not _is_namespace(n) else None
        if target is None and _is_namespace(n):
            fn = f"{n.target.name}.{fn}"  # type: ignore[union-attr]
        args = list(n.args)
        sz = self.size_or_unknown
        if fn == "_+_" and len(args) == 2:
            return self.cost_add(n, args[0], args[1])
        if fn in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and len(args) == 2:
            return self.cost_compare(fn, args[0], args[1])
        if fn == "@in" and len(args) == 2:
            container = self.kind(args[1])
            if container in MAP_KINDS:
                return 1
            return max(1, factor(sz(args[1])[1], 1.0)) if container in ("dyn", "any") else factor(sz(args[1])[1], 1.0)
        if target is not None:
            own = self.member_cost(n, fn, target, args)
            if own is not None:
                return own
        own = self.global_cost(n, fn, args)
        return own if own is not None else 1

    def cost_add(self, n: Call, left: Node, right: Node) -> int:
        kinds = {self.kind(left), self.kind(right)} - {"dyn", "any"}
        result = size_add(self.size_or_unknown(left), self.size_or_unknown(right))
        if kinds & {"string", "bytes"} or not kinds:
            self.sizes[id(n)] = result
            return factor(result[1], STRING_FACTOR)
        if kinds == {"list"}:
            self.sizes[id(n)] = result
            left_entry, right_entry = self.entry(left), self.entry(right)
            if left_entry is not None:
                merged = left_entry.union(right_entry)
                if merged is not None:
                    self.entries[id(n)] = merged
        return 1

    def cost_compare(self, fn: str, left: Node, right: Node) -> int:
        lk, rk = self.kind(left), self.kind(right)
        if fn == "_==_" and lk == rk and lk in ("quantity", "semver"):
            return 1  # Kubernetes' library: O(1) equality of its own types
        if fn in ("_==_", "_!=_") or ({lk, rk} & {"string", "bytes"}) or {lk, rk} <= {"dyn", "any"}:
            smallest = min(self.size_or_unknown(left)[1], self.size_or_unknown(right)[1])
            by_size = factor(smallest, STRING_FACTOR)
            if fn in ("_==_", "_!=_") or {lk, rk} & {"string", "bytes"}:
                return by_size
            return max(1, by_size)
        return 1

    def member_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        """The cost of receiver-style call target.fn(args), None when no rule below covers it."""
        rule = _MEMBER_COSTS.get(fn)
        return rule(self, n, fn, target, args) if rule is not None else None

    # Rules for member calls, one per group of functions that cel-go or Kubernetes' library charges alike.
    # Each takes (call, function name, receiver, arguments) and returns None where its guard fails.

    def list_scan_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        tsize, tkind = self.size_or_unknown(target), self.kind(target)
        if tkind == "list":
            element = 1
            elem = self.elems.get(id(target), "dyn")
            if elem in ("string", "bytes"):
                elem_size = declared_size((*self.path(target), "@items")) if self.path(target) else None
                element = add(element, factor((elem_size or UNKNOWN)[1], STRING_FACTOR))
            return mul(tsize[1], element)
        if tkind in ("string", "dyn", "any") and fn in ("indexOf", "lastIndexOf"):
            return factor(tsize[1], STRING_FACTOR)
        return None

    def same_size_string_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        tsize = self.size_or_unknown(target)
        self.sizes[id(n)] = tsize
        return factor(tsize[1], STRING_FACTOR)

    def replace_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if len(args) < 2:
            return None
        tsize = self.size_or_unknown(target)
        self.sizes[id(n)] = replaced_size(tsize, self.size_or_unknown(args[0]), self.size_or_unknown(args[1]))
        return factor(tsize[1], 2 * STRING_FACTOR)

    def split_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        tsize = self.size_or_unknown(target)
        limit = tsize[1]
        if len(args) > 1 and isinstance(args[1], Literal) and isinstance(args[1].value, int):
            limit = args[1].value % (1 << 64)
        self.sizes[id(n)] = (0, limit)
        return factor(tsize[1], 2 * STRING_FACTOR)

    def join_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        tsize, tkind = self.size_or_unknown(target), self.kind(target)
        joined: Size = (0, 0)
        if tkind == "list" or tkind in ("dyn", "any"):
            elem_size = declared_size((*self.path(target), "@items")) if self.path(target) else None
            joined = size_mul(tsize, elem_size or UNKNOWN)
        if args:
            separators = (max(tsize[0] - 1, 0), max(tsize[1] - 1, 0))
            joined = size_add(joined, size_mul(self.size_or_unknown(args[0]), separators))
        self.sizes[id(n)] = joined
        return factor(joined[1], STRING_FACTOR)

    def regex_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if not args or (fn == "matches" and len(args) != 1):
            return None
        tsize = self.size_or_unknown(target)
        if fn != "matches":  # find, findAll
            self.sizes[id(n)] = (0, tsize[1])
        return mul(factor(add(tsize[1], 1), STRING_FACTOR), factor(self.size_or_unknown(args[0])[1], REGEX_FACTOR))

    def contains_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if len(args) != 1:
            return None
        return mul(factor(self.size_or_unknown(target)[1], STRING_FACTOR),
                   factor(self.size_or_unknown(args[0])[1], STRING_FACTOR))

    def affix_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        return factor(self.size_or_unknown(args[0])[1], STRING_FACTOR) if len(args) == 1 else None

    def format_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        return factor(self.size_or_unknown(target)[1], STRING_FACTOR) if self.kind(target) == "string" else None

    # cel-go's lists extension (version 3)

    def slice_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if len(args) != 2:
            return None
        start = _int_literal(args[0], 0)
        end = _int_literal(args[1], self.size_or_unknown(target)[1])
        length = max(end - start, 0) % (1 << 64)
        return self.allocating_list(n, 1.0, (length, length))

    def reverse_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if args or self.kind(target) == "string":
            return None
        return self.allocating_list(n, 1.0, self.size_or_unknown(target))

    def flatten_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if self.kind(target) == "string":
            return None
        depth = _int_literal(args[0], U64) if args else 1
        return self.allocating_list(n, float(depth), self.size_or_unknown(target))

    def distinct_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if args:
            return None
        tsize = self.size_or_unknown(target)
        return self.allocating_list(n, 2.0, size_mul(tsize, tsize))

    def sort_cost(self, n: Call, fn: str, target: Node, args: list[Node]) -> int | None:
        if args:
            return None
        tsize = self.size_or_unknown(target)
        extra = STRING_FACTOR if self.elems.get(id(target)) in ("string", "bytes") else 0.0
        return self.allocating_list(n, 2.0 + extra, size_mul(tsize, tsize))

    def global_cost(self, n: Call, fn: str, args: list[Node]) -> int | None:
        sz = self.size_or_unknown
        if fn in ("quantity", "isQuantity", "semver", "isSemver") and args:
            return factor(sz(args[0])[1], STRING_FACTOR)
        if fn == "strings.quote" and len(args) == 1:
            s = sz(args[0])
            self.sizes[id(n)] = (add(s[0], 2), add(mul(s[1], 2), 2))
            return factor(s[1], STRING_FACTOR)
        # for an argument of unknown type cel-go charges the costliest overload: the string/bytes one
        if fn == "bytes" and len(args) == 1 and self.kind(args[0]) in ("string", "dyn", "any"):
            s = sz(args[0])
            self.sizes[id(n)] = (s[0], mul(s[1], 4))
            return factor(s[1], STRING_FACTOR)
        if fn == "string" and len(args) == 1 and self.kind(args[0]) in ("bytes", "dyn", "any"):
            s = sz(args[0])
            self.sizes[id(n)] = (s[0] // 4, s[1])
            return factor(s[1], STRING_FACTOR)
        if fn == "lists.range" and len(args) == 1:
            count = _int_literal(args[0], U64)
            return self.allocating_list(n, 1.0, (count, count))
        if fn in ("sets.contains", "sets.intersects", "sets.equivalent") and len(args) == 2:
            product = size_mul(sz(args[0]), sz(args[1]))
            return add(factor(product[1], 2.0 if fn == "sets.equivalent" else 1.0), 1)
        return None

    def allocating_list(self, n: Call, per_element: float, size: Size) -> int:
        self.sizes[id(n)] = size
        return add(add(factor(size[1], per_element), 1), LIST_CREATE)


def _constant(cost: int) -> Callable[[Coster, Call, str, Node, list[Node]], int | None]:
    return lambda *_: cost


_MEMBER_COSTS: dict[str, Callable[[Coster, Call, str, Node, list[Node]], int | None]] = {
    **dict.fromkeys(("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"), Coster.list_scan_cost),
    **dict.fromkeys(("lowerAscii", "upperAscii", "substring", "trim"), Coster.same_size_string_cost),
    "replace": Coster.replace_cost,
    "split": Coster.split_cost,
    "join": Coster.join_cost,
    **dict.fromkeys(("find", "findAll", "matches"), Coster.regex_cost),
    # Kubernetes' Quantity and Semver methods are O(1)
    **dict.fromkeys(("sign", "asInteger", "isInteger", "asApproximateFloat", "isGreaterThan", "isLessThan",
                     "compareTo", "add", "sub", "major", "minor", "patch"), _constant(1)),
    "includes": _constant(MAX_LIST_ATTRIBUTE_VALUES),  # ResourceSliceMaxAttributeValuesPerDevice
    "contains": Coster.contains_cost,
    **dict.fromkeys(("startsWith", "endsWith"), Coster.affix_cost),
    "format": Coster.format_cost,
    "slice": Coster.slice_cost,
    "reverse": Coster.reverse_cost,
    "flatten": Coster.flatten_cost,
    "distinct": Coster.distinct_cost,
    "sort": Coster.sort_cost,
}


def _int_literal(n: Node, default: int) -> int:
    if isinstance(n, Literal) and isinstance(n.value, int) and not isinstance(n.value, bool):
        return n.value % (1 << 64)  # Go converts the int64 to uint64
    return default


def _is_namespace(n: Call) -> bool:
    return isinstance(n.target, Ident) and n.target.name in ("strings", "sets", "lists", "optional", "math",
                                                             "base64", "ip", "format")


def estimate(ast: Node, types: dict[int, str], elems: dict[int, str]) -> int:
    """The maximum estimated cost of `ast` (saturating at 2^64-1, as cel-go's is)."""
    return Coster(types, elems).cost(ast)
