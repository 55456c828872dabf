# SPDX-License-Identifier: Apache-2.0
"""check_doc_refs.py on the repository (every reference into the docs names a heading that exists,
none cites a part by its number, CONTRIBUTING.md names real files and functions), and on small
trees with one fault each, which it must name by file and line."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import check_doc_refs  # noqa: E402


def test_the_repository_holds_its_references():
    problems = check_doc_refs.check(SRC)
    assert problems == [], "\n".join(problems)


def test_the_command_exits_0_here_and_1_on_a_fault(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(HERE, "check_doc_refs.py"), SRC], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    tree = _tree(tmp_path, {"src/a.c": '/* see docs/ARCHITECTURE.md "The resident runtimes" */\n'})
    p = subprocess.run([sys.executable, os.path.join(HERE, "check_doc_refs.py"), str(tree)], capture_output=True, text=True)
    assert p.returncode == 1 and "src/a.c:1:" in p.stdout, p.stdout + p.stderr


def _tree(tmp_path, files):
    """a copy of the repository's docs and CONTRIBUTING.md, plus the given files"""
    root = tmp_path / "repo"
    shutil.copytree(os.path.join(SRC, "docs"), root / "docs")
    for name in ("README.md", "CONTRIBUTING.md"):
        shutil.copy(os.path.join(SRC, name), root / name)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def _problems(tmp_path, files):
    root = _tree(tmp_path, files)
    # CONTRIBUTING.md's names are checked against the real sources: keep them out of these trees
    (root / "CONTRIBUTING.md").write_text("# Contributing\n", encoding="utf-8")
    return check_doc_refs.check(str(root))


GOOD = ('/* The resident runtime (docs/ARCHITECTURE.md "The resident runtime"); docs/ARCHITECTURE.md\n'
        ' * "One observation, end to end" is one line below */\n'
        '/* (docs/ARCHITECTURE.md "LLM", "Action expert" and "Sessions"), README.md "Commands" */\n'
        '/* the full heading: docs/ARCHITECTURE.md "Sessions (`src/runtime/session.h`)" */\n'
        '/* RFC 6455 section 1.3 names its standard */\n')


def test_good_references_pass(tmp_path):
    assert _problems(tmp_path, {"src/good.c": GOOD.replace("ARCHITECTURE.md\n *", "ARCHITECTURE.md")}) == []


@pytest.mark.parametrize("text, line, words", [
    ('int x;\n/* docs/ARCHITECTURE.md "The resident runtimes" */\n', 2, ["has no heading", "The resident runtimes"]),
    ('/* docs/ARCHITECTURE.md "resident runtime" */\n', 1, ["has no heading"]),
    ('/* docs/ARCHITEKTUR.md "Sessions" */\n', 1, ["there is no docs/ARCHITEKTUR.md"]),
    ('/* docs/ARCHITECTURE.md "LLM", "Action expert" and "Sesions" */\n', 1, ['"Sesions"']),
    ('/* docs/ARCHITECTURE.md "LLM", "Action expert",\n * "Sesions" */\n', 2, ['"Sesions"']),
    ('/* docs/ARCHITECTURE.md\n * "Sessions" */\n', 1, ["split over two lines"]),
    ('/* docs/ARCHITECTURE.md "The resident\n * runtime" */\n', 1, ["past the end of the line"]),
    ('/* the resident runtime (docs/ARCHITECTURE.md section 12) */\n', 1, ["by its number", "section 12"]),
    ('/* Architecture doc sections 2-5. */\n', 1, ["by its number"]),
    ('/* architecture doc\n * sections 6.4 and 7 */\n', 2, ["by its number"]),
    ('/* see the section\n * 12 of the doc */\n', 1, ["by its number"]),
    ('# the prompt (architecture doc 6)\n', 1, ["by its number"]),
    ('/* the weight names, §9 */\n', 1, ["by its number"]),
    ('Normalised (section 8) first.\n', 1, ["by its number"]),
    ('/* (README.md "Run on the GPU") */\n', 1, ["README.md has no heading"]),
])
def test_a_fault_is_named_by_file_and_line(tmp_path, text, line, words):
    problems = _problems(tmp_path, {"src/model/bad.c": text})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"src/model/bad.c:{line}:"), problems
    for w in words:
        assert w in problems[0], problems


def test_every_scanned_kind_of_file(tmp_path):
    files = {p: '# docs/ARCHITECTURE.md "No such part"\n' for p in
             ("tools/t.c", "include/t.h", "python/t.py", "scripts/t.sh", "tests/t.py", "reference/t.py", "bench/t.py",
              "CMakeLists.txt", "docs/NEW.md")}
    problems = _problems(tmp_path, files)
    assert sorted(p.split(":")[0] for p in problems) == sorted(files), problems


def test_contributing_names_real_files_and_functions(tmp_path):
    root = _tree(tmp_path, {"src/kernels/gemm.c": "static void choose_kernels(void) {}\ntypedef struct ma_kctx { int scalar; } ma_kctx;\n"})
    (root / "CONTRIBUTING.md").write_text(
        "# Contributing\n\n## Adding a kernel\n\n"
        "1. In `src/kernels/gemm.c` (`gemm.c`), `choose_kernels()` calls `ma_gemm_install_<isa>`; `ma_kctx.scalar`.\n"
        "2. Then `src/kernels/gemm_nope.c`, `choose_kernel_sets()`, `gemm_nope.c` and `ma_kctx.scalr`.\n"
        "```sh\nnot_checked_in_a_code_block src/none.c\n```\n", encoding="utf-8")
    problems = check_doc_refs.check(str(root))
    assert [p.split(": ", 1)[0] for p in problems] == ["CONTRIBUTING.md:6"] * 4, problems
    for p, words in zip(problems, ["`src/kernels/gemm_nope.c`: no such file", "`choose_kernel_sets()`: no source file",
                                   "`gemm_nope.c`: no file of the repository", "`ma_kctx.scalr`: no source file has the name scalr"]):
        assert words in p, problems
