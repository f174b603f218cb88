"""Tests wait on events, not on time.

Unit tests (tests/unit) sleep for no fixed time: they wait on a condition or counter with a
deadline (tests/fakes/await.h, whose bounded poll is the one real pause) or move a FakeClock
(its SleepForMs moves fake time and is not a sleep). Every other test's sleep says why it is
fine in a comment on its line or the line above (a poll interval inside a deadline loop, a
writer's pacing, a measuring window).
"""
import os
import re
import unittest

ROOT = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
SLEEP = re.compile(r"\b(?:std::this_thread::sleep_for|sleep_until|usleep|nanosleep|"
                   r"absl::SleepFor|time\.sleep)\s*\(|(?<![\w.:])sleep\s*\(")
THE_ONE_POLL = "tests/fakes/await.h"
SUFFIXES = (".cc", ".h", ".py", ".sh")


def test_files():
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.endswith(SUFFIXES):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, ROOT), path


def sleeps(path):
    """(line number, line, previous line) of each sleep call outside comments."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        code = line.split("//")[0] if path.endswith((".cc", ".h")) else line.split("#")[0]
        if SLEEP.search(code):
            yield i + 1, line, lines[i - 1] if i > 0 else ""


def commented(line, previous):
    for text in (line, previous):
        if "#" in text or "//" in text:
            return True
    return False


class SleepsTest(unittest.TestCase):
    def test_unit_tests_do_not_sleep(self):
        found = []
        for rel, path in test_files():
            if rel.startswith("tests/unit/") or (rel.startswith("tests/fakes/")
                                                  and rel != THE_ONE_POLL):
                found += ["%s:%d: %s" % (rel, n, line.strip()) for n, line, _ in sleeps(path)]
        self.assertEqual(found, [], "fixed sleeps in unit tests: wait on a condition or counter "
                         "(tests/fakes/await.h) or move a FakeClock instead")

    def test_every_other_sleep_says_why(self):
        found = []
        for rel, path in test_files():
            if rel.startswith(("tests/unit/", "tests/repo/")):
                continue
            for n, line, previous in sleeps(path):
                if not commented(line, previous):
                    found.append("%s:%d: %s" % (rel, n, line.strip()))
        self.assertEqual(found, [], "sleeps without a comment saying why they are fine")


if __name__ == "__main__":
    unittest.main()
