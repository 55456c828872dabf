# SPDX-License-Identifier: Apache-2.0
"""Shared by every pytest suite of the project (tests/, python/tests/, reference/tests/; pytest
reads the conftest.py of each directory above a test file): a session that passed leaves no
files behind.

pytest keeps the temporary directories of its last three sessions, and each ctest entry is a
session of its own, so a compile's gigabyte at real widths stayed on disk through three more
suites (a CI machine with little free space ran out in the sanitizer pass). A failed session's
directory is kept for reading."""
import shutil

import pytest


@pytest.fixture(scope="session", autouse=True)
def _remove_tmp_when_passed(request, tmp_path_factory):
    yield
    if request.session.testsfailed == 0:
        shutil.rmtree(tmp_path_factory.getbasetemp(), ignore_errors=True)
