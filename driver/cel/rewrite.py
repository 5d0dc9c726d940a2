"""Engine-neutral rewrites for Kubernetes CEL features that neither Python engine ships.

Two-variable comprehensions (`all(k, v, p)`, `exists(k, v, p)`, `existsOne(k, v, p)`,
`transformList(i, v, [filter,] e)`) become one-variable macros with `cel.bind`. The range is
bound once under a reserved name and the macro dispatches on its runtime type, so the same
rewrite works for lists (index, element) and maps (key, value).
`transformMap`/`transformMapEntry` build maps and have no one-variable equivalent; they stay
unsupported.
"""

from __future__ import annotations

from driver.cel.syntax import Call, Ident, Node, map_children

_RANGE_VAR = "__tessera_range_{}__"


def expand_two_variable_macros(ast: Node) -> Node:
    counter = [0]

    def visit(n: Node) -> Node:
        n = map_children(n, visit)
        if not (isinstance(n, Call) and n.target is not None and len(n.args) >= 3
                and isinstance(n.args[0], Ident) and isinstance(n.args[1], Ident)):
            return n
        fn = n.function
        if fn in ("all", "exists", "existsOne") and len(n.args) == 3:
            macro = "exists_one" if fn == "existsOne" else fn
            bodies: tuple[Node, ...] = (n.args[2],)
        elif fn == "transformList" and len(n.args) in (3, 4):
            macro = "map"
            bodies = tuple(n.args[2:])
        else:
            return n
        counter[0] += 1
        o = n.offset
        rng = Ident(o, _RANGE_VAR.format(counter[0]))
        key, value = n.args[0], n.args[1]

        def over(source: Node) -> Node:
            bound = tuple(Call(o, "bind", (value, Call(o, "_[_]", (rng, key)), b), Ident(o, "cel")) for b in bodies)
            return Call(o, macro, (key, *bound), source)

        as_list = over(Call(o, "range", (Call(o, "size", (rng,)),), Ident(o, "lists")))
        is_map = Call(o, "_==_", (Call(o, "type", (rng,)), Ident(o, "map")))
        chosen = Call(o, "_?_:_", (is_map, over(rng), as_list))
        return Call(o, "bind", (rng, Call(o, "dyn", (n.target,)), chosen), Ident(o, "cel"))

    return visit(ast)

