"""Evaluations per second of representative DRA selectors on both CEL engines (same devices).

Run: python -m benchmarks.cel_bench [--devices N]. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

from driver import DRIVER_NAME
from driver.cel import DeviceView, compile_selector, device_view

A = f'device.attributes["{DRIVER_NAME}"]'
C = f'device.capacity["{DRIVER_NAME}"]'
SELECTORS = {
    "driver": f'device.driver == "{DRIVER_NAME}"',
    "product+memory": f'{A}.productName.startsWith("NVIDIA H100") && {C}.memory.compareTo(quantity("40Gi")) >= 0',
    "semver": f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))',
    "guarded-mig": f'{A}.type == "mig" && "profile" in {A} && {A}.profile == "1g.10gb"',
    "bind+regex": f'cel.bind(g, {A}, g.numaNode == 0 && g.productName.matches("^NVIDIA (A|H)100"))',
    "exists-domains": 'device.attributes.exists(d, d.startsWith("resource.")) && "memory" in '
                      f'device.capacity["{DRIVER_NAME}"]',
}


def devices(n: int) -> list[DeviceView]:
    out: list[DeviceView] = []
    for i in range(n):
        mig = i % 4 == 3
        attrs = {"type": {"string": "mig" if mig else "gpu"},
                 "productName": {"string": "NVIDIA H100 80GB HBM3" if i % 3 else "NVIDIA A100-SXM4-40GB"},
                 "driverVersion": {"version": "550.54.15" if i % 2 else "535.104.5"},
                 "numaNode": {"int": i % 2},
                 "resource.kubernetes.io/pciBusID": {"string": f"0000:{i % 256:02x}:00.0"}}
        if mig:
            attrs["profile"] = {"string": "1g.10gb"}
        out.append(device_view(DRIVER_NAME, {"name": f"gpu-{i}", "attributes": attrs,
                                        "capacity": {"memory": {"value": "80Gi" if i % 3 else "40Gi"}}}))
    return out


def measure(engine: str, expression: str, views: list[DeviceView], budget_s: float) -> tuple[float, int]:
    selector = compile_selector(expression, engine=engine)
    for v in views[:10]:  # warm the per-device caches
        selector.evaluate(v)
    count = matches = 0
    start = time.perf_counter()
    while True:
        for v in views:
            matches += selector.evaluate(v)
        count += len(views)
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s:
            return count / elapsed, matches * len(views) // count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per selector and engine")
    args = parser.parse_args()
    views = devices(args.devices)
    engines = ("celexpr", "celpy")
    print(f"CEL selector evaluations per second ({args.devices} devices, one thread)")
    print(f"{'selector':<16}" + "".join(f"{e:>14}" for e in engines) + f"{'ratio':>8}{'matches':>9}")
    for name, expression in SELECTORS.items():
        rates = []
        matched = 0
        for engine in engines:
            rate, matched = measure(engine, expression, views, args.seconds)
            rates.append(rate)
        print(f"{name:<16}" + "".join(f"{r:>14,.0f}" for r in rates) + f"{rates[0] / rates[1]:>7.1f}x"
              f"{matched:>9}")


if __name__ == "__main__":
    main()
