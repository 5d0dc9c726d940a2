"""The function signatures of the Kubernetes DRA CEL environment, for tessera's static checks.

Overloads are (member?, argument types, result type) over simple type names ("dyn" is unknown,
"*" in an argument list accepts anything). Costs are driver.cel.cost's.
"""

from __future__ import annotations

NUMERIC = ("int", "uint", "double")
COMPARABLE = ("int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration")

# Functions of the Kubernetes DRA environment: name -> overloads (member?, argument types, result).
# "A" in an argument list means "same type as the receiver"; "*" means any type.
Overload = tuple[bool, tuple[str, ...], str]
FUNCTIONS: dict[str, tuple[Overload, ...]] = {
    "size": ((False, ("string",), "int"), (False, ("bytes",), "int"), (False, ("list",), "int"),
             (False, ("map",), "int"), (True, ("string",), "int"), (True, ("bytes",), "int"),
             (True, ("list",), "int"), (True, ("map",), "int")),
    "contains": ((True, ("string", "string"), "bool"),),
    "startsWith": ((True, ("string", "string"), "bool"),),
    "endsWith": ((True, ("string", "string"), "bool"),),
    "matches": ((True, ("string", "string"), "bool"), (False, ("string", "string"), "bool")),
    "int": tuple((False, (t,), "int") for t in ("int", "uint", "double", "string", "timestamp", "duration")),
    "uint": tuple((False, (t,), "uint") for t in ("int", "uint", "double", "string")),
    "double": tuple((False, (t,), "double") for t in ("int", "uint", "double", "string")),
    "string": tuple((False, (t,), "string") for t in ("int", "uint", "double", "string", "bytes", "bool",
                                                        "timestamp", "duration")),
    "bytes": ((False, ("string",), "bytes"), (False, ("bytes",), "bytes")),
    "bool": ((False, ("bool",), "bool"), (False, ("string",), "bool")),
    "dyn": ((False, ("*",), "dyn"),),
    "type": ((False, ("*",), "type"),),
    "duration": ((False, ("string",), "duration"),),
    "timestamp": ((False, ("string",), "timestamp"), (False, ("int",), "timestamp")),
    # quantity library
    "quantity": ((False, ("string",), "quantity"),),
    "isQuantity": ((False, ("string",), "bool"),),
    "sign": ((False, ("quantity",), "int"),),
    "isGreaterThan": ((True, ("quantity", "quantity"), "bool"), (True, ("semver", "semver"), "bool")),
    "isLessThan": ((True, ("quantity", "quantity"), "bool"), (True, ("semver", "semver"), "bool")),
    "compareTo": ((True, ("quantity", "quantity"), "int"), (True, ("semver", "semver"), "int")),
    "asApproximateFloat": ((True, ("quantity",), "double"),),
    "asInteger": ((True, ("quantity",), "int"),),
    "isInteger": ((True, ("quantity",), "bool"),),
    "add": ((True, ("quantity", "quantity"), "quantity"), (True, ("quantity", "int"), "quantity")),
    "sub": ((True, ("quantity", "quantity"), "quantity"), (True, ("quantity", "int"), "quantity")),
    # semver library
    "semver": ((False, ("string",), "semver"), (False, ("string", "bool"), "semver")),
    "isSemver": ((False, ("string",), "bool"), (False, ("string", "bool"), "bool")),
    "major": ((True, ("semver",), "int"),),
    "minor": ((True, ("semver",), "int"),),
    "patch": ((True, ("semver",), "int"),),
    # regex library
    "find": ((True, ("string", "string"), "string"),),
    "findAll": ((True, ("string", "string"), "list"), (True, ("string", "string", "int"), "list")),
    # strings extension v2
    "charAt": ((True, ("string", "int"), "string"),),
    "indexOf": ((True, ("string", "string"), "int"), (True, ("string", "string", "int"), "int"),
                (True, ("list", "*"), "int")),
    "lastIndexOf": ((True, ("string", "string"), "int"), (True, ("string", "string", "int"), "int"),
                    (True, ("list", "*"), "int")),
    "lowerAscii": ((True, ("string",), "string"),),
    "upperAscii": ((True, ("string",), "string"),),
    "replace": ((True, ("string", "string", "string"), "string"),
                (True, ("string", "string", "string", "int"), "string")),
    "split": ((True, ("string", "string"), "list"), (True, ("string", "string", "int"), "list")),
    "substring": ((True, ("string", "int"), "string"), (True, ("string", "int", "int"), "string")),
    "trim": ((True, ("string",), "string"),),
    "join": ((True, ("list",), "string"), (True, ("list", "string"), "string")),
    "format": ((True, ("string", "list"), "string"),),
    "strings.quote": ((False, ("string",), "string"),),
    # Kubernetes lists library
    "isSorted": ((True, ("list",), "bool"),),
    # DRA list-type attributes (1.36): scalar equality or list membership
    "includes": ((True, ("*", "*"), "bool"),),
    "sum": ((True, ("list",), "dyn"),),
    "min": ((True, ("list",), "dyn"),),
    "max": ((True, ("list",), "dyn"),),
    # cel-go lists extension v3 and sets
    "slice": ((True, ("list", "int", "int"), "list"),),
    "flatten": ((True, ("list",), "list"), (True, ("list", "int"), "list")),
    "distinct": ((True, ("list",), "list"),),
    "reverse": ((True, ("list",), "list"),),
    "sort": ((True, ("list",), "list"),),
    "lists.range": ((False, ("int",), "list"),),
    "sets.contains": ((False, ("list", "list"), "bool"),),
    "sets.equivalent": ((False, ("list", "list"), "bool"),),
    "sets.intersects": ((False, ("list", "list"), "bool"),),
    # optional library
    "optional.of": ((False, ("*",), "optional"),),
    "optional.ofNonZeroValue": ((False, ("*",), "optional"),),
    "optional.none": ((False, (), "optional"),),
    "hasValue": ((True, ("optional",), "bool"),),
    "value": ((True, ("optional",), "dyn"),),
    "orValue": ((True, ("optional", "*"), "dyn"),),
    "or": ((True, ("optional", "optional"), "optional"),),
    "first": ((True, ("list",), "optional"),),
    "last": ((True, ("list",), "optional"),),
}
# Present in the Kubernetes environment but not type-checked here (URL/IP/CIDR/format/time/authz).
UNCHECKED_FUNCTIONS = frozenset({
    "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery", "ip", "isIP",
    "ip.isCanonical", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast",
    "isGlobalUnicast", "cidr", "isCIDR", "containsIP", "containsCIDR", "masked", "prefixLength", "format.named",
    "format.dns1123Label", "format.dns1123Subdomain", "format.dns1035Label", "format.qualifiedName",
    "format.dns1123LabelPrefix", "format.dns1123SubdomainPrefix", "format.dns1035LabelPrefix", "format.labelValue",
    "format.uri", "format.uuid", "format.byte", "format.date", "format.datetime", "validate", "getFullYear",
    "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
    "getMilliseconds", "optional.unwrap", "unwrapOpt",
})
OPTIONAL_MACROS = frozenset({"optMap", "optFlatMap"})
MACROS_1VAR = frozenset({"all", "exists", "exists_one", "map", "filter", "sortBy"})
MACROS_2VAR = frozenset({"all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry"})
REGEX_FUNCTIONS = frozenset({"matches", "find", "findAll"})
TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"})
NOT_INDEXABLE = frozenset({"string", "bytes", "int", "uint", "double", "bool", "null", "quantity", "semver", "type"})


OPERATOR_RESULT = {
    "_==_": "bool", "_!=_": "bool", "_<_": "bool", "_<=_": "bool", "_>_": "bool", "_>=_": "bool", "@in": "bool",
    "!_": "bool", "_+_": "same", "_-_": "same", "_*_": "same", "_/_": "same", "_%_": "same", "-_": "same",
}
