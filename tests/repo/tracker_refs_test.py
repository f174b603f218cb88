"""The repository explains itself: no code, test, doc or script cites an issue number of a tracker
outside it ("issue 35, item 4"). Such a reference means nothing to a reader of a clone, and the
sentence around it usually leaves out what the issue said; write that instead.
"""
import os
import re
import unittest

ROOT = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
REFERENCE = re.compile(r"\b[Ii]ssues?\s*#?\d+\b|\bGH-\d+\b")
FOLDERS = ("bench", "client", "common", "deploy", "docs", "master", "offload", "proto", "python",
           "tests", "tools", "transfer", ".ci")
SUFFIXES = (".cc", ".h", ".cu", ".py", ".sh", ".md", ".txt", ".yml", ".yaml", ".flags", ".proto",
            ".toml", ".service", ".json", ".cmake")
SKIP_DIRS = {"__pycache__", "corpus", "node_modules"}


def files():
    yield "README.md", os.path.join(ROOT, "README.md")
    for folder in FOLDERS:
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".venv")]
            for name in names:
                if name.endswith(SUFFIXES) or name in ("CMakeLists.txt", "run"):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, ROOT), path


class TrackerReferencesTest(unittest.TestCase):
    def test_no_outside_issue_numbers(self):
        found = []
        for rel, path in files():
            if rel == os.path.join("tests", "repo", "tracker_refs_test.py"):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if REFERENCE.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
        self.assertEqual(found, [], "outside tracker references; say what the issue said instead:\n"
                         + "\n".join(found))


if __name__ == "__main__":
    unittest.main()
