# SPDX-License-Identifier: Apache-2.0
"""The project's long-running scripts print their usage for --help (and do nothing else: no
install, no build, no measurement), and refuse an unknown option naming it, with status 2."""
import os
import subprocess

import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


@pytest.mark.parametrize("script, usage", [
    ("scripts/test.sh", "scripts/test.sh [--quick]"),
    ("bench/compare.sh", "bench/compare.sh [--runs N]"),
    ("bench/fullsize.sh", "bench/fullsize.sh [--work DIR]"),
])
def test_help_prints_usage_and_exits(script, usage, tmp_path):
    for flag in ("--help", "-h"):
        p = subprocess.run(["bash", os.path.join(SRC, script), flag], capture_output=True, text=True, timeout=20, cwd=tmp_path)
        assert p.returncode == 0 and usage in p.stdout and not p.stderr, p.stdout + p.stderr
        assert not p.stdout.startswith("#") and "SPDX" not in p.stdout, p.stdout
    assert os.listdir(tmp_path) == []  # nothing written where it ran
    p = subprocess.run(["bash", os.path.join(SRC, script), "--no-such-option"], capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert p.returncode == 2 and "unknown option --no-such-option" in p.stderr, p.stdout + p.stderr
