"""The per-module test-count floor: a run that silently lost tests fails.

``tests/MIN_TESTS`` lists, for every test module, how many of its tests must run (not skip).  A module
that stops collecting, loses parametrizations, or starts skipping shows up here, as does a new module
nobody added to the floor.  Tests that run only on some CPUs (``CPU_SKIPS``: the int8_linear kernel where VNNI
exists) skip elsewhere with that reason; the floor is written where they run, and a run on another CPU is owed that
many fewer of its module's tests (printed).

    python scripts/test_floor.py check JUNIT_XML      # after a run that selected every test
    python scripts/test_floor.py write JUNIT_XML      # rewrite tests/MIN_TESTS from a full green run
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FLOOR = Path(__file__).resolve().parents[1] / "tests" / "MIN_TESTS"
HEADER = ("# Tests that must run (not skip) per module; scripts/test.sh fails a full run below any of these.\n"
          "# Regenerate after adding tests: python scripts/test_floor.py write .cache/junit.xml\n")


#: skip reasons of tests that run only on some CPUs (the floor is written where they run): a run on another CPU
#: owes its module that many fewer tests, and says so
CPU_SKIPS = ("where VNNI sums int8 in int32",)


def _module(case: ET.Element) -> str:
    # classname is the dotted module path, plus the class for tests inside a class
    parts = case.get("classname", "").split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else "(unknown)"


def ran_per_module(junit: Path) -> Counter[str]:
    ran: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is None:
            ran[_module(case)] += 1
    return ran


def cpu_skips_per_module(junit: Path) -> Counter[str]:
    skipped: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        skip = case.find("skipped")
        if skip is not None and any(reason in skip.get("message", "") for reason in CPU_SKIPS):
            skipped[_module(case)] += 1
    return skipped


def read_floor() -> dict[str, int]:
    floor = {}
    for line in FLOOR.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            count, module = line.split()
            floor[module] = int(count)
    return floor


def check(junit: Path) -> int:
    ran, floor, cpu = ran_per_module(junit), read_floor(), cpu_skips_per_module(junit)
    for module, n in sorted(cpu.items()):
        print(f"test floor: {module}: {n} test(s) skipped on this CPU ({', '.join(CPU_SKIPS)}), owed {n} fewer")
    problems = [f"{module}: {ran.get(module, 0)} ran, at least {need - cpu.get(module, 0)} expected"
                for module, need in sorted(floor.items()) if ran.get(module, 0) < need - cpu.get(module, 0)]
    problems += [f"{module}: {n} ran but the module is not in tests/MIN_TESTS (run scripts/test_floor.py write)"
                 for module, n in sorted(ran.items()) if module not in floor]
    print(f"tests run: {sum(ran.values())} in {len(ran)} modules (floor: {sum(floor.values())} in {len(floor)})")
    for problem in problems:
        print(f"test floor: {problem}", file=sys.stderr)
    return 1 if problems else 0


def write(junit: Path) -> int:
    ran = ran_per_module(junit) + cpu_skips_per_module(junit)  # the floor of a CPU where they run, written on any
    FLOOR.write_text(HEADER + "".join(f"{n} {module}\n" for module, n in sorted(ran.items())))
    print(f"wrote {FLOOR}: {sum(ran.values())} tests in {len(ran)} modules")
    return 0


if __name__ == "__main__":
    command, junit = sys.argv[1], Path(sys.argv[2])
    sys.exit({"check": check, "write": write}[command](junit))
