"""Optional values are typed as cel-go types them (each case confirmed with Kubernetes' compiler; the
seeded differential test in e2e/test_cel_oracle_environments.py covers many more)."""

from __future__ import annotations

import pytest

from driver.cel import CelCompileError, compile_selector

G = 'device.attributes["gpu.tessera.dev"]'
C = 'device.capacity["gpu.tessera.dev"]'


@pytest.mark.parametrize(("expression", "message"), [
    (f"optional.ofNonZeroValue(7) == {C}.?memory",
     "no matching overload for '_==_' applied to '(optional_type(int), optional_type(quantity))'"),
    (f"{C}.?memory.orValue(semver(\"9.0.0\")) == quantity(\"1\")",
     "no matching overload for 'orValue' applied to 'optional_type(quantity).(semver)'"),
    ('optional.of(device.driver).orValue(quantity("80Gi")) == quantity("1")',
     "no matching overload for 'orValue' applied to 'optional_type(string).(quantity)'"),
    ('optional.of(1).or(optional.of("a")).value() == 1',
     "no matching overload for 'or' applied to 'optional_type(int).(optional_type(string))'"),
    ("optional.none().value()", "must evaluate to bool or the unknown type, not dyn"),
])  # fmt: skip
def test_optionals_of_two_known_types_do_not_mix(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_selector(expression)


@pytest.mark.parametrize(("expression", "cost"), [
    (f"optional.of(1) == {G}.?numaNode", 6),  # an attribute's value is `any`: any optional compares
    ("optional.none() == optional.of(1)", 3),  # optional.none()'s type binds to the other side's
    ("optional.none().orValue(true)", 2),  # ... and to orValue()'s argument
    (f'{G}[?"type"].orValue(1) == "gpu"', 6),
])  # fmt: skip
def test_optionals_holding_an_unknown_type_mix_with_any(expression: str, cost: int) -> None:
    assert compile_selector(expression).estimated_cost == cost
