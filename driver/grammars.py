"""What Kubernetes accepts as a name: DNS labels and subdomains, C identifiers, label keys and values.

The apiserver checks these with anchored regular expressions; Python's `$` also matches before a trailing
newline, so every pattern here ends in `\\Z` and "abc\\n" is refused as Kubernetes refuses it.
"""

from __future__ import annotations

import re

MAX_ID_LENGTH = 32
MAX_DRIVER_NAME_LENGTH = 63
MAX_LABEL_VALUE_LENGTH = 63

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(DNS_SUBDOMAIN.match(value))


def is_c_identifier(value: str) -> bool:
    return bool(_C_IDENTIFIER.match(value))


def is_label_value(value: object) -> bool:
    """A label (or taint) value: empty, or at most 63 of [A-Za-z0-9-_.] starting and ending alphanumeric."""
    return isinstance(value, str) and len(value) <= MAX_LABEL_VALUE_LENGTH and bool(_LABEL_VALUE.match(value))


def qualified_name_errors(name: str) -> list[str]:
    """Problems with an attribute or capacity key: `<C identifier>` or `<domain>/<C identifier>`."""
    problems: list[str] = []
    parts = name.split("/")
    if len(parts) > 2:
        # Stricter than the 1.36 apiserver, which lets this through by oversight (a TODO in its validation):
        # such a key cannot be addressed from CEL or in a constraint, so tessera never publishes one.
        return ["must be <identifier> or <domain>/<identifier>, with at most one '/'"]
    ident = parts[-1]
    if len(parts) == 2:
        domain = parts[0]
        if not domain:
            problems.append("the domain must not be empty")
        else:
            problems.extend(driver_name_problems(domain))
    if not ident:
        problems.append("the name must not be empty")
    else:
        if len(ident) > MAX_ID_LENGTH:
            problems.append(f"the name {ident!r} is longer than {MAX_ID_LENGTH} characters")
        if not is_c_identifier(ident):
            problems.append(
                f"the name {ident!r} must be a C identifier ([A-Za-z_][A-Za-z0-9_]*): no '-' or '.', e.g. pciBusID"
            )
    return problems


def driver_name_problems(name: str) -> list[str]:
    """Problems with a driver name (or an attribute key's domain): a DNS subdomain of at most 63 characters."""
    problems = []
    if len(name) > MAX_DRIVER_NAME_LENGTH:
        problems.append(f"{name!r} is longer than {MAX_DRIVER_NAME_LENGTH} characters")
    if not DNS_SUBDOMAIN.match(name.lower()):
        problems.append(
            f"{name!r} must be a DNS subdomain (lower case letters, digits, '-' and '.'), e.g. gpu.tessera.dev"
        )
    return problems


def label_key_problems(key: str) -> list[str]:
    """Problems with a label or taint key: `[<DNS subdomain>/]<name>`."""
    prefix, _, name = key.rpartition("/")
    problems = []
    if "/" in key and not prefix:
        problems.append("prefix part must not be empty")
    if prefix and not is_dns_subdomain(prefix):
        problems.append(f"prefix {prefix!r} must be a DNS subdomain")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        problems.append(
            f"name part {name!r} must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        )
    return problems
