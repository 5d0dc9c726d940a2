"""The Kubernetes DRA CEL environment for device selectors (see docs in each module).

Public API:
- compile_selector(expression, *, engine=None, environment=STORED) -> CompiledSelector (CelCompileError
  on rejection); environment: CelEnvironment (new or stored expressions, DRA feature gates)
- CompiledSelector.evaluate(device_view) -> bool (CelRuntimeError; CelBudgetExceeded when cel-cpp's fixed
  iteration budget stops it: the outcome is unknown, not an error), .reads, .result_type
- device_view(driver, device_dict, *, list_type_attributes=False) -> DeviceView
- AttributeRead, CelCompileError, CelRuntimeError, DeviceViewError
- driver.quantity.Quantity, driver.semver.Version
Engine: cel-expr-python by default; TESSERA_CEL_ENGINE=celpy|celexpr or engine= selects one.
Fidelity: tests/driver/cel/corpus.json, every case confirmed against Kubernetes' own CEL library.
"""

from driver.cel.device import DeviceView, device_view
from driver.cel.environment import NEW, STORED, CelEnvironment, with_feature_gates
from driver.cel.errors import CelBudgetExceeded, CelCompileError, CelRuntimeError, DeviceViewError
from driver.cel.findings import AttributeRead
from driver.cel.selector import DEFAULT_ENGINE, ENGINE_ENV_VAR, ENGINES, CompiledSelector, compile_selector

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "ENGINE_ENV_VAR",
    "NEW",
    "STORED",
    "AttributeRead",
    "CelBudgetExceeded",
    "CelCompileError",
    "CelEnvironment",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceView",
    "DeviceViewError",
    "compile_selector",
    "device_view",
    "with_feature_gates",
]
