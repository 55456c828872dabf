# SPDX-License-Identifier: Apache-2.0
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.dirname(HERE)
ROOT = os.path.dirname(REF)
sys.path.insert(0, REF)

UPSTREAM = os.environ.get("MOLMOACT_UPSTREAM_FIXTURE",
                          os.path.join(ROOT, "tests", "fixtures", "upstream-tiny"))
ASSETS = os.path.join(ROOT, "assets")


def close(actual, expected, cos_min=0.999999, rel=1e-4):
    """cosine >= cos_min and max|diff| <= rel * rms(expected); returns (cos, maxdiff/rms)."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(expected, dtype=np.float64).ravel()
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    rms = np.sqrt(np.mean(b * b)) if b.size else 0.0
    if rms == 0.0:
        assert np.array_equal(a, b)
        return 1.0, 0.0
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    md = float(np.max(np.abs(a - b)) / rms)
    assert cos >= cos_min and md <= rel, f"cos {cos:.9f} (min {cos_min}), maxdiff/rms {md:.2e} (max {rel})"
    return cos, md


@pytest.fixture(scope="session")
def upstream_dir():
    path = os.path.join(UPSTREAM, "full")
    if not os.path.isdir(path):
        pytest.skip(f"upstream fixture not found at {UPSTREAM}")
    return path


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory):
    from molmoact_ref import checkpoint
    d = str(tmp_path_factory.mktemp("tiny_grid"))
    checkpoint.make("tiny", "grid", 0, d)
    return d

