"""Limits Kubernetes applies to DRA device selectors.

The first two are CELSelectorExpressionMaxLength and CELSelectorExpressionMaxCost in
k8s.io/api/resource/v1 (types.go), enforced by apiserver validation; the sizes are the bounds the
cost estimator in k8s.io/dynamic-resource-allocation/cel (compile.go) assumes for a device's maps,
strings and list attributes.
"""

MAX_EXPRESSION_BYTES = 10 * 1024
MAX_COST = 1_000_000
MAX_MAP_ENTRIES = 32  # attributes + capacities per device, and domains
MAX_STRING_SIZE = 64
MAX_DRIVER_SIZE = 63
MAX_LIST_ATTRIBUTE_VALUES = 48
MAX_ID_SIZE = 32  # the name part of an attribute or capacity key
MAX_DOMAIN_SIZE = 63
