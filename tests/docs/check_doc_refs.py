#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""References into the docs that stay true (issue 37).

A reference to a part of a document is written in one form, which this check finds and holds to
the document:

    docs/ARCHITECTURE.md "The resident runtime"
    docs/ARCHITECTURE.md "LLM", "Action expert" and "Sessions"   (several parts of one document)
    README.md "Commands"                                         (README.md, CONTRIBUTING.md too)

The quoted text is a heading of that document without its number ("## 12. The resident runtime
(`src/runtime/resident.c`)" is "The resident runtime (`src/runtime/resident.c`)"), or that text up
to its first " (" ("The resident runtime"). A reference stays on one line.

It fails, naming file:line, when
  - the document does not exist, or no heading (outside code blocks) has the quoted text;
  - a reference starts on one line and goes on on the next (a part of it would go unchecked);
  - a document's part is cited by its number ("section 12", "sections 2-5", "sec. 3", "§4",
    "architecture doc 6"): numbers change when a part is added. A number in an external standard
    (RFC 6455 section 1.3) is allowed when the standard is named just before it;
  - CONTRIBUTING.md names, in `backticks` outside code blocks, a repository path that does not
    exist (`src/kernels/gemm.c`), a file name no file has (`gemm_impl.h`), or a C or CMake name
    (`choose_kernels()`, `ma_kctx.scalar`, `set_source_files_properties`) that no source file
    holds: its recipes name the real files and functions. Spans with a placeholder
    (`gemm_<isa>.c`) and other code (`sets[n_sets] = ...`) are not checked.

    /usr/bin/python3 tests/docs/check_doc_refs.py [SOURCE_DIR]      (exit 1 on a failure)
"""

import os
import re
import sys

# what is scanned for references, relative to the source directory
SCAN = ["src", "tools", "include", "python", "docs", "README.md", "CONTRIBUTING.md", "scripts", "tests", "reference",
        "bench", "examples", "fuzz", "cmake", "CMakeLists.txt"]
SKIP_DIRS = {".git", "fixtures", "__pycache__", "node_modules", ".pytest_cache"}
TEXT_EXT = {".c", ".h", ".py", ".sh", ".md", ".txt", ".cmake", ".toml", ".in", ".js", ".mjs", ".yml", ".yaml", ".cfg", ".map"}
MAX_BYTES = 1 << 20
SELF = "tests/docs/"  # this check and its tests write the forms they look for on purpose

# a comment's continuation between two lines: newline, indentation, a comment leader
NL = r"[ \t]*\n[ \t]*(?:\*|#+|//)?[ \t]*"
TARGET = r"(?<![\w./-])(docs/[A-Za-z0-9_-]+\.md|README\.md|CONTRIBUTING\.md)"
REF = re.compile(TARGET + r' "([A-Za-z0-9`][^"\n]*)"')
MORE = re.compile(r'(?:,|,? and)(?:[ \t]+|' + NL + r')"([^"\n]+)"')
SPLIT = re.compile(TARGET + NL + r'"')
OPEN = re.compile(TARGET + r' "[A-Za-z0-9`][^"\n]*\n')
NUMBERED = re.compile(r"\b(?:sections?|sec\.)(?:[ \t]+|" + NL + r")\(?\d|§[ \t]*\d|\barchitecture doc(?:ument)?,?[ \t]+\(?\d",
                      re.I)
EXTERNAL = re.compile(r"\b(?:RFC|ISO|IEC|IEEE|POSIX|ECMA|ITU|PEP)\b|\bC(?:99|11|17|23)\b")

HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
NUMBER = re.compile(r"^\d+(?:\.\d+)*\.?[ \t]+")
FENCE = re.compile(r"^[ \t]*(```|~~~)")

# CONTRIBUTING.md's names
PATH_SPAN = re.compile(r"^(?:src|tests|bench|scripts|cmake|docs|include|python|tools|reference|fuzz|examples|assets|\.ci)/[\w./-]*$|"
                       r"^[\w-]+\.(?:txt|md|json)$")
BARE_FILE = re.compile(r"^[\w-]+\.(?:c|h|py|sh|cmake)$")  # a file named without its directory: it exists somewhere
# a C or CMake name, a member (ma_kctx.scalar, k->name), a call (choose()) or an element (sets[0])
IDENT_SPAN = re.compile(r"^([A-Za-z_]\w*)(?:(?:\.|->)([A-Za-z_]\w*))?(?:\(\)|\[\d*\])?$")
CODE_EXT = {".c", ".h", ".cmake", ".txt", ".sh", ".py"}


def headings(path):
    """the names a reference may use for the headings of one markdown file: name -> count"""
    names, fenced = {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if not m:
                continue
            full = NUMBER.sub("", m.group(2))
            for name in {full, full.split(" (")[0]}:
                names[name] = names.get(name, 0) + 1
    return names


def text_files(root):
    for top in SCAN:
        p = os.path.join(root, top)
        if os.path.isfile(p):
            yield top
            continue
        for d, dirs, files in os.walk(p):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("build"))
            for name in sorted(files):
                ext = os.path.splitext(name)[1]
                if ext in TEXT_EXT or name == "CMakeLists.txt":
                    yield os.path.relpath(os.path.join(d, name), root)


def read(root, rel):
    path = os.path.join(root, rel)
    if os.path.getsize(path) > MAX_BYTES:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        return None


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_refs(root, rel, text, cache, problems):
    def doc_names(target):
        if target not in cache:
            p = os.path.join(root, target)
            cache[target] = headings(p) if os.path.isfile(p) else None
        return cache[target]

    for m in REF.finditer(text):
        target, sections, end = m.group(1), [(m.group(2), m.start(2))], m.end()
        while True:
            more = MORE.match(text, end)
            if not more:
                break
            sections.append((more.group(1), more.start(1)))
            end = more.end()
        names = doc_names(target)
        for section, pos in sections:
            where = f"{rel}:{line_of(text, pos)}"
            if names is None:
                problems.append(f'{where}: {target} "{section}": there is no {target}')
            elif section not in names:
                problems.append(f'{where}: {target} "{section}": {target} has no heading "{section}" '
                                f'(headings: {"; ".join(sorted(n for n in names if " (" not in n))})')
            elif names[section] > 1:
                problems.append(f'{where}: {target} "{section}": {names[section]} headings of {target} have that name')
    for m in SPLIT.finditer(text):
        problems.append(f"{rel}:{line_of(text, m.start())}: a reference into {m.group(1)} split over two lines: keep "
                        f'{m.group(1)} "<heading>" on one line')
    for m in OPEN.finditer(text):
        problems.append(f"{rel}:{line_of(text, m.start())}: the heading named after {m.group(1)} runs past the end of the line")


def check_numbers(rel, text, problems):
    for m in NUMBERED.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[max(line_start - 1, m.start() - 120):m.start()]
        if EXTERNAL.search(before):
            continue
        line = text[line_start:text.find("\n", m.end()) if "\n" in text[m.end():] else len(text)].strip()
        problems.append(f'{rel}:{line_of(text, m.start())}: a part of a document cited by its number ("{m.group(0).strip()}"): '
                        f'cite it by its heading, as docs/ARCHITECTURE.md "Sessions" ({line[:120]})')


def check_names(root, doc, code_words, file_names, problems):
    path = os.path.join(root, doc)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fenced = False
    for i, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in re.findall(r"`([^`\n]+)`", line):
            span = span.strip()
            if "<" in span or "*" in span:
                continue
            if PATH_SPAN.match(span):
                if not os.path.exists(os.path.join(root, span.rstrip("/"))):
                    problems.append(f"{doc}:{i}: `{span}`: no such file or directory in the repository")
                continue
            if BARE_FILE.match(span):
                if span not in file_names:
                    problems.append(f"{doc}:{i}: `{span}`: no file of the repository has this name")
                continue
            m = IDENT_SPAN.match(span)
            for name in (m.groups() if m else ()):
                if name and name not in code_words:
                    problems.append(f"{doc}:{i}: `{span}`: no source file has the name {name}")


def check(root):
    problems, cache, code, file_names = [], {}, [], set()
    for rel in text_files(root):
        file_names.add(os.path.basename(rel))
        text = read(root, rel)
        if text is None:
            continue
        if os.path.splitext(rel)[1] in CODE_EXT or os.path.basename(rel) == "CMakeLists.txt":
            code.append(text)
        if rel.startswith(SELF):
            continue
        check_refs(root, rel, text, cache, problems)
        check_numbers(rel, text, problems)
    check_names(root, "CONTRIBUTING.md", set(re.findall(r"\w+", "\n".join(code))), file_names, problems)
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_doc_refs: {len(problems)} problem(s); a reference takes the form docs/<FILE>.md \"<Heading>\" (see {SELF}check_doc_refs.py)")
        return 1
    print("check_doc_refs: every reference into the docs names an existing heading")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
