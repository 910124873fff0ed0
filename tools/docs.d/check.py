#!/usr/bin/env python3
"""tools/docs.d/check.py: the checks tools/docs runs over README.md and docs/*.md (no Doxygen).

  snippets   every ```cpp block follows a line `<!-- snippet: PATH -->` and is exactly the file
             PATH, or with `PATH#NAME` exactly the lines of PATH between `// snippet-begin: NAME`
             and `// snippet-end: NAME`; every examples/snippets/*.cpp is shown somewhere, and its
             first line names the page that shows it (`// docs/grants.md ...`).
  history    no dated line (2026-11-29, 12-04) and no issue reference ("issue 24", "#43") outside
             CHANGELOG.md and docs/performance.md: dates and history belong to commit messages,
             the changelog and the records behind the performance page.
  figures    every measured figure in README.md and docs/ (outside CHANGELOG.md and
             docs/performance.md, which is rendered from the records) lies inside the text a record
             of bench/results/records.json quotes for that page ("quoted": [{page, text}]), and every
             quoted text is still on its page. A measured figure: a number with a unit of time
             (ns, µs, ms, s, min, h), a percentage, a decimal ratio (1.2x), "N of M", or a count of
             outcomes (cases, assertions, executions, breaches, attempts, steps, reports, denials,
             operations, bad inputs, lines, instructions, requests/s, ops/s). Numbers without
             such a unit (256 configures, 8-bit, 4 x 1000 requests, Linux 6.12) are not figures.
  links      every relative link [text](path#anchor) names a file of the repository (and, in a
             markdown file, a heading of it); every file the text cites (`examples/x.cpp`,
             `rdmaxx/asio.hpp`, `FOO.md`) exists.
Usage: check.py [snippets|history|figures|links ...]   (default: all)
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
PAGES = ["README.md"] + sorted(glob.glob("docs/*.md"))
HISTORY_EXEMPT = {"CHANGELOG.md", "docs/performance.md"}
RECORDS = os.environ.get("RDMAXX_RECORDS", "bench/results/records.json")
errors = []


def err(path, line, msg):
    errors.append(f"{path}:{line}: {msg}")


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def check_snippets():
    shown = set()
    for page in PAGES:
        ls = lines_of(page)
        i = 0
        while i < len(ls):
            if ls[i].startswith("```cpp"):
                m = re.match(r"^<!-- snippet: (\S+) -->$", ls[i - 1]) if i else None
                j = i + 1
                while j < len(ls) and ls[j] != "```":
                    j += 1
                code = ls[i + 1:j]
                if not m:
                    err(page, i + 1, "```cpp block without a <!-- snippet: PATH --> line before it")
                else:
                    path = m.group(1)
                    file, _, name = path.partition("#")
                    shown.add(file if not name else path)
                    if not name and file.startswith("examples/snippets/") and os.path.isfile(file) and \
                            not lines_of(file)[0].startswith(f"// {page}"):
                        err(file, 1, f"its first line should say where it is shown: // {page} ...")
                    if not os.path.isfile(file):
                        err(page, i + 1, f"snippet {file} does not exist")
                    else:
                        src = lines_of(file)
                        if src and src[-1] == "":
                            src = src[:-1]
                        if name:
                            try:
                                b = src.index(f"// snippet-begin: {name}") if f"// snippet-begin: {name}" in src else \
                                    next(k for k, s in enumerate(src) if s.strip() == f"// snippet-begin: {name}")
                                e = next(k for k, s in enumerate(src) if k > b and s.strip() == f"// snippet-end: {name}")
                                src = src[b + 1:e]
                            except StopIteration:
                                err(page, i + 1, f"{file} has no snippet-begin/end: {name}")
                                src = None
                        if src is not None and src != code:
                            import difflib
                            d = "\n".join(difflib.unified_diff(src, code, path, f"{page} block", lineterm=""))
                            err(page, i + 1, f"the block marked {path} differs from the file:\n{d}")
                i = j
            i += 1
    for f in sorted(glob.glob("examples/snippets/*.cpp")):
        if f not in shown:
            err(f, 1, "is not shown in README.md or docs/ (no <!-- snippet: PATH --> block)")


DATE = re.compile(r"(?<![\w.])(?:\d{4}-)?(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\w.])")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/])#\d+\b")


def check_history():
    for page in PAGES:
        if page in HISTORY_EXEMPT:
            continue
        for n, line in enumerate(lines_of(page), 1):
            if DATE.search(line):
                err(page, n, f"a dated line ({DATE.search(line).group(0)}): dates belong to commits and records")
            if ISSUE.search(line):
                err(page, n, f"an issue reference ({ISSUE.search(line).group(0)}): history belongs to commits")


FIGURE = re.compile(
    r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?(?:"
    r"\s?%|\s?(?:ns|µs|us|ms|s|min|h)\b(?![-/])|(?<=\.\d)\d*\s?[x×](?=[\s,;.)])|(?<=\d) of \d[\d,]*\b"
    r"| (?:device |test )*(?:cases|assertions|(?:M )?executions|breaches|attempts|steps|reports|denials|"
    r"operations|bad inputs|lines|instructions|requests/s|ops/s|req/s)\b)")


def paragraphs(path):
    """(first line number, text, line starts): runs of non-blank lines outside code fences, joined
    by one space; a table row is a paragraph of its own."""
    out, cur, fence = [], [], False
    def flush():
        if cur:
            starts, text = [], ""
            for n, l in cur:
                starts.append((len(text), n))
                text += l.strip() + " "
            out.append((text, starts))
            cur.clear()
    for n, line in enumerate(lines_of(path), 1):
        if line.startswith("```"):
            flush()
            fence = not fence
        elif fence:
            continue
        elif not line.strip() or line.startswith("|"):
            flush()
            if line.startswith("|"):
                cur.append((n, line))
                flush()
        else:
            cur.append((n, line))
    flush()
    return out


def check_figures():
    quotes = {}
    recs = json.load(open(RECORDS))["records"]
    for r in recs:
        for q in r.get("quoted") or []:
            quotes.setdefault(q["page"], []).append((q["text"], r["name"]))
    for page in PAGES:
        if page in HISTORY_EXEMPT:
            continue
        found = set()
        for text, starts in paragraphs(page):
            spans = []
            for q, name in quotes.get(page, []):
                k = text.find(q)
                while k >= 0:
                    spans.append((k, k + len(q)))
                    found.add(q)
                    k = text.find(q, k + 1)
            for m in FIGURE.finditer(text):
                if not any(a <= m.start() and m.end() <= b for a, b in spans):
                    line = max(n for off, n in starts if off <= m.start())
                    err(page, line, f"the figure {m.group(0).strip()!r} is in no record: add a record quoting it "
                                    f"(bench/results/records.json, \"quoted\") or drop it")
        for q, name in quotes.get(page, []):
            if q not in found:
                err(page, 1, f"record {name!r} quotes text that is no longer on the page: {q!r}")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out, fence = set(), False
    for line in lines_of(path):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            m = re.match(r"^#{1,6} (.*)$", line)
            if m:
                out.add(slug(m.group(1)))
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITE_DIRS = ("examples/", "test/", "bench/", "tools/", "docs/", "include/", "cmake/", ".ci/")
CITE = re.compile(r"`([^`\s]+)`|(?<![\w/.-])([A-Za-z][\w-]*\.md)\b")


def exists_cited(tok, base):
    tok = tok.split("#")[0].rstrip(".,:;")
    tok = re.sub(r"\[[^\]]*\]$", "", tok)
    cands = [tok, tok + ".cpp", os.path.join(base, tok), "include/" + tok, "include/rdmaxx/" + tok]
    return any(glob.glob(c) for c in cands)


def check_links():
    for page in PAGES + ["CHANGELOG.md"]:
        base = os.path.dirname(page)
        fence = False
        for n, line in enumerate(lines_of(page), 1):
            if line.startswith("```"):
                fence = not fence
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                path = os.path.normpath(os.path.join(base, file)) if file else page
                if not os.path.exists(path):
                    err(page, n, f"dangling link {target}")
                elif anchor and path.endswith(".md") and anchor not in anchors(path):
                    err(page, n, f"dangling link {target}: no heading #{anchor} in {path}")
            if fence:
                continue
            for a, b in CITE.findall(LINK.sub("", line)):
                tok = a or b
                if b or (tok.startswith(CITE_DIRS) or re.match(r"^rdmaxx/[\w/]+\.hpp$", tok)
                         or re.match(r"^[\w-]+\.(md|json)$", tok)):
                    if "*" not in tok and any(c in tok for c in "$<>{}~") :
                        continue
                    if tok.startswith(("build", "/")):
                        continue
                    if "NAME" in tok or "NN_" in tok:
                        continue
                    if not exists_cited(tok, base):
                        err(page, n, f"cites {tok}, which is not in the repository")


checks = sys.argv[1:] or ["snippets", "history", "figures", "links"]
for c in checks:
    {"snippets": check_snippets, "history": check_history, "figures": check_figures, "links": check_links}[c]()
for e in errors:
    print(e, file=sys.stderr)
if errors:
    print(f"tools/docs: {len(errors)} problem(s) in README.md and docs/", file=sys.stderr)
    sys.exit(1)
print(f"tools/docs: {', '.join(checks)}: README.md and docs/ are clean")
