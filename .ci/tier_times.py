"""Print the fast tier's and the full suite's test time from one full run's JUnit XML.

    python .ci/tier_times.py JUNIT_XML FAST_IDS

FAST_IDS: `pytest --collect-only -q -m "not slow"`'s node ids, one a line. The times are the
tests' own (setup, call and teardown), without collection."""

import sys
import xml.etree.ElementTree as ET

cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
fast_ids = {line.strip() for line in open(sys.argv[2]) if "::" in line}
total = fast = 0.0
for case in cases:
    t = float(case.get("time", 0.0))
    node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
    total += t
    fast += t if node in fast_ids else 0.0
print(
    f"tests' own time, summed over the workers: full suite {total / 60:.1f} min, fast tier (-m 'not slow') {fast / 60:.1f} min"
)
