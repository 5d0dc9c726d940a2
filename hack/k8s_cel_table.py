"""Extract Kubernetes' own DRA CEL test table into tests/driver/cel/k8s_table.json.

    python -m hack.k8s_cel_table          # regenerate the file (needs Go and the harness' module cache)
    python -m hack.k8s_cel_table --check  # exit 1 when the checked-in file is not what it would write

The table lives in k8s.io/dynamic-resource-allocation/cel (the version e2e/harness/go.mod pins), read
from the Go module cache that `bash e2e/harness/build.sh` fills ($TESSERA_CACHE/go/mod):
- compile_test.go `testcases`, which TestCEL runs once per DRAListTypeAttributes setting when a case
  leaves it open. The table holds Go values (fmt.Sprintf, closures building 32 attributes), so Go
  evaluates it: the package's sources are copied into a scratch copy of the harness module, next to a
  test of ours that writes `testcases` as JSON, and `go test` runs it together with Kubernetes' TestCEL
  (so the table is known to pass at this version). Nothing leaves the scratch directory.
- cache_test.go, whose expressions sit in code, not in a table: each GetOrCompile call and the
  assertion after it on `.Error` (compiles or not), read from the source text.
- compile_test.go TestInterrupt: its expression, which must compile; the rest of that test cancels the
  evaluation's context.

Each case records the environment Kubernetes compiled it in (`env`: new or stored expressions, the
DRAConsumableCapacity and DRAListTypeAttributes gates), the device, and what the Go test asserts:
`expect` (true/false, or a compile or runtime error, with Kubernetes' message in `kubernetesMessage`),
`estimatedCost`, or only `compiles`. The file has the corpus shape (tests/driver/cel/README.md), so
e2e/test_oracles.py also runs it through the Go oracle.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "e2e" / "harness"
OUTPUT = REPO / "tests" / "driver" / "cel" / "k8s_table.json"
MODULE = "k8s.io/dynamic-resource-allocation"

# Our test, added beside Kubernetes' own in the scratch package: it writes `testcases` as JSON.
_EXPORT_TEST = """package cel

import (
\t"encoding/json"
\t"os"
\t"testing"
)

func TestTesseraExportTable(t *testing.T) {
\ttype exported struct {
\t\tName                     string `json:"name"`
\t\tEnvType                  *string `json:"envType"`
\t\tEnableConsumableCapacity bool `json:"enableConsumableCapacity"`
\t\tEnableListTypeAttributes *bool `json:"enableListTypeAttributes"`
\t\tExpression               string `json:"expression"`
\t\tDriver                   string `json:"driver"`
\t\tAllowMultipleAllocations *bool `json:"allowMultipleAllocations"`
\t\tAttributes               any `json:"attributes"`
\t\tCapacity                 any `json:"capacity"`
\t\tExpectCompileError       string `json:"expectCompileError"`
\t\tExpectMatchError         string `json:"expectMatchError"`
\t\tExpectMatch              bool `json:"expectMatch"`
\t\tExpectCost               uint64 `json:"expectCost"`
\t}
\tvar out []exported
\tfor name, c := range testcases {
\t\tvar env *string
\t\tif c.envType != nil {
\t\t\ts := string(*c.envType)
\t\t\tenv = &s
\t\t}
\t\tout = append(out, exported{name, env, c.enableConsumableCapacity, c.enableListTypeAttributes, c.expression,
\t\t\tc.driver, c.allowMultipleAllocations, c.attributes, c.capacity, c.expectCompileError, c.expectMatchError,
\t\t\tc.expectMatch, c.expectCost})
\t}
\tdata, err := json.Marshal(out)
\tif err != nil {
\t\tt.Fatal(err)
\t}
\tif err := os.WriteFile(os.Getenv("TESSERA_TABLE_OUT"), data, 0o600); err != nil {
\t\tt.Fatal(err)
\t}
}
"""


class ExtractionError(RuntimeError):
    """The Go module or toolchain is missing, or Kubernetes' test files changed shape."""


def module_version() -> str:
    """The version of k8s.io/dynamic-resource-allocation that e2e/harness/go.mod pins."""
    text = (HARNESS / "go.mod").read_text()
    m = re.search(rf"^\s*{re.escape(MODULE)} => {re.escape(MODULE)} (v\S+)", text, re.M) or re.search(
        rf"^\s*{re.escape(MODULE)} (v\S+)", text, re.M)
    if m is None:
        raise ExtractionError(f"e2e/harness/go.mod does not require {MODULE}")
    return m.group(1)


def go_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "GOMODCACHE": str(cache / "go" / "mod"), "GOCACHE": str(cache / "go" / "build"),
            "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-mod=mod", "GOPROXY": "off", "CGO_ENABLED": "0"}


def package_dir(cache: Path, version: str) -> Path:
    path = cache / "go" / "mod" / f"{MODULE}@{version}" / "cel"
    if not (path / "compile_test.go").is_file():
        raise ExtractionError(f"{path}/compile_test.go is missing: run `bash e2e/harness/build.sh` first, which "
                              "downloads the harness' Go modules into that cache")
    return path


def run_go_table(source: Path, cache: Path) -> list[dict[str, Any]]:
    """Kubernetes' `testcases` as Go builds them, after TestCEL passed on them."""
    if shutil.which("go") is None:
        raise ExtractionError("no `go` on PATH; the extraction runs Kubernetes' test table with Go >= 1.26")
    with tempfile.TemporaryDirectory(prefix="tessera-k8s-cel-") as tmp:
        work = Path(tmp)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(HARNESS / name, work / name)
        pkg = work / "dracel"
        pkg.mkdir()
        for src in sorted(source.glob("*.go")):
            # cache_test.go needs testify, which the harness' module graph lacks; it is read as text instead
            if not src.name.endswith("_test.go") or src.name == "compile_test.go":
                shutil.copyfile(src, pkg / src.name)
        (pkg / "zz_tessera_export_test.go").write_text(_EXPORT_TEST)
        out = work / "table.json"
        proc = subprocess.run(
            ["go", "test", "-count=1", "-run", "^(TestCEL|TestTesseraExportTable)$", "./dracel"],
            cwd=work, env={**go_env(cache), "TESSERA_TABLE_OUT": str(out)}, capture_output=True, text=True,
            check=False)
        if proc.returncode != 0 or not out.exists():
            raise ExtractionError(f"go test of Kubernetes' CEL table failed (rc {proc.returncode}):\n"
                                  f"{(proc.stdout + proc.stderr)[-4000:]}")
        table: list[dict[str, Any]] = json.loads(out.read_text())
        return table


def split_qualified(key: str, driver: str) -> tuple[str, str]:
    """Go's parseQualifiedName: split at the first "/", the driver is the domain of a bare name."""
    domain, sep, name = key.partition("/")
    return (domain, name) if sep else (driver, key)


def corpus_device(case: dict[str, Any]) -> dict[str, Any]:
    """A Go test device (qualified names as keys) in corpus form (grouped by domain)."""
    driver = case["driver"]
    device: dict[str, Any] = {"driver": driver}
    attributes: dict[str, dict[str, Any]] = {}
    for key, value in sorted((case["attributes"] or {}).items()):
        domain, name = split_qualified(key, driver)
        attributes.setdefault(domain, {})[name] = value
    capacity: dict[str, dict[str, str]] = {}
    for key, value in sorted((case["capacity"] or {}).items()):
        domain, name = split_qualified(key, driver)
        capacity.setdefault(domain, {})[name] = value["value"]
    if attributes:
        device["attributes"] = attributes
    if capacity:
        device["capacity"] = capacity
    if case["allowMultipleAllocations"] is not None:
        device["allowMultipleAllocations"] = case["allowMultipleAllocations"]
    return device


def table_cases(table: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(case, device) per TestCEL subtest, named as `go test -v` names them."""
    for row in sorted(table, key=lambda r: r["name"]):
        settings = [row["enableListTypeAttributes"]] if row["enableListTypeAttributes"] is not None else [False, True]
        for list_types in settings:
            env = {"type": "new" if row["envType"] == "NewExpressions" else "stored",
                   "consumableCapacity": row["enableConsumableCapacity"], "listTypeAttributes": list_types}
            case: dict[str, Any] = {"name": f"{row['name']}-list-type-attributes-{str(list_types).lower()}",
                                    "expression": row["expression"], "device": row["name"], "env": env,
                                    "origin": "compile_test.go TestCEL"}
            if row["expectCompileError"]:
                case["expect"] = {"error": "compile"}
                case["kubernetesMessage"] = row["expectCompileError"]
            else:
                case["estimatedCost"] = row["expectCost"]
                if row["expectMatchError"]:
                    case["expect"] = {"error": "runtime"}
                    case["kubernetesMessage"] = row["expectMatchError"]
                else:
                    case["expect"] = row["expectMatch"]
            yield case, corpus_device(row)


_GO_STRING = r'"(?:[^"\\]|\\.)*"|`[^`]*`'


def go_string(literal: str) -> str:
    if literal.startswith("`"):
        return literal[1:-1]
    value: str = json.loads(literal)
    return value


def cache_cases(source: str) -> list[dict[str, Any]]:
    """cache_test.go: every expression given to GetOrCompile and whether the next assertion on a
    result's `.Error` says it compiles (Nil) or not (NotNil)."""
    call = re.compile(rf"GetOrCompile\((?P<arg>{_GO_STRING}|fmt\.Sprintf\((?P<fmt>{_GO_STRING}), (?P<vars>[\w, ]+)\))\)"
                      r"\s*\n\s*(?:require|assert)\.(?P<check>Nil|NotNil)\(t, \w+\.Error\)")
    cases: list[dict[str, Any]] = []
    seen: set[str] = set()
    for m in call.finditer(source):
        expressions = _formatted(source, m) if m.group("fmt") else [go_string(m.group("arg"))]
        for expression in expressions:
            if expression in seen:
                continue
            seen.add(expression)
            case: dict[str, Any] = {"name": f"cache-{len(cases) + 1}", "expression": expression, "device": "empty",
                                    "env": {"type": "stored", "consumableCapacity": False, "listTypeAttributes": False},
                                    "origin": "cache_test.go"}
            if m.group("check") == "Nil":
                case["compiles"] = True
            else:
                case["expect"] = {"error": "compile"}
            cases.append(case)
    if not cases:
        raise ExtractionError("cache_test.go has no GetOrCompile call followed by an .Error assertion any more")
    return cases


def _formatted(source: str, m: re.Match[str]) -> list[str]:
    """fmt.Sprintf(format, i, i) inside `for i := 0; i < N; i++`, with N a literal or a local set to one."""
    loops = list(re.finditer(r"for (\w+) := 0; \1 < (\w+); \1\+\+", source[: m.start()]))
    loop = loops[-1] if loops else None
    names = {v.strip() for v in m.group("vars").split(",")}
    if loop is None or names != {loop.group(1)}:
        raise ExtractionError(f"cache_test.go: cannot evaluate {m.group(0).splitlines()[0]!r} (expected a loop "
                              "variable as its only argument)")
    bound = loop.group(2)
    if not bound.isdigit():
        assigned = re.findall(rf"\b{bound} := (\d+)", source[: loop.start()])
        if not assigned:
            raise ExtractionError(f"cache_test.go: the loop bound {bound} is not a literal")
        bound = assigned[-1]
    template = go_string(m.group("fmt"))
    count = template.count("%d")
    return [template.replace("%d", "{}").format(*([i] * count)) for i in range(int(bound))]


def interrupt_cases(source: str) -> list[dict[str, Any]]:
    """TestInterrupt: the expression must compile (Features{}, stored); each variant then cancels."""
    body = re.search(r"func TestInterrupt\(t \*testing\.T\) \{(?P<body>.*?)\n\}\n", source, re.S)
    if body is None:
        raise ExtractionError("compile_test.go has no TestInterrupt any more")
    names = re.search(r"for _, name := range \[\]string\{(?P<names>[^}]*)\}", body.group("body"))
    expression = re.search(rf"expression := (?P<e>{_GO_STRING})", body.group("body"))
    if names is None or expression is None:
        raise ExtractionError("compile_test.go TestInterrupt changed shape (variant names or expression)")
    return [{"name": f"interrupt-{go_string(n.strip())}", "expression": go_string(expression.group("e")),
             "device": "empty", "env": {"type": "stored", "consumableCapacity": False, "listTypeAttributes": False},
             "compiles": True, "origin": "compile_test.go TestInterrupt"}
            for n in names.group("names").split(",") if n.strip()]


def build(cache: Path) -> dict[str, Any]:
    version = module_version()
    source = package_dir(cache, version)
    devices: dict[str, dict[str, Any]] = {"empty": {"driver": ""}}
    cases: list[dict[str, Any]] = []
    for case, device in table_cases(run_go_table(source, cache)):
        devices[case["device"]] = device
        cases.append(case)
    cases.extend(cache_cases((source / "cache_test.go").read_text()))
    cases.extend(interrupt_cases((source / "compile_test.go").read_text()))
    return {
        "source": f"{MODULE}@{version} cel/compile_test.go and cel/cache_test.go, extracted by "
                  "`python -m hack.k8s_cel_table`; do not edit by hand",
        "devices": dict(sorted(devices.items())),
        "cases": cases,
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.k8s_cel_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in file instead of writing")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    try:
        text = render(build(cache))
    except ExtractionError as exc:
        sys.stderr.write(f"k8s_cel_table: {exc}\n")
        return 2
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            sys.stderr.write(f"k8s_cel_table: {args.output} is out of date; run python -m hack.k8s_cel_table\n")
            return 1
        return 0
    args.output.write_text(text)
    count = len(json.loads(text)["cases"])
    sys.stderr.write(f"k8s_cel_table: wrote {count} cases to {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
