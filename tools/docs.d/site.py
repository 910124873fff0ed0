#!/usr/bin/env python3
"""tools/docs.d/site.py OUTDIR: README.md and docs/*.md as HTML pages in OUTDIR (README.md is
index.html), next to the Doxygen reference in OUTDIR/reference/, then a link check over the pages.

A small markdown converter (headings, fenced code, tables, lists, paragraphs, code spans, bold,
links, images): the Python `markdown` module and pandoc are not Debian-12 defaults here, and the
pages use nothing more. Links to a page (x.md) become x.html, links to repository files point at
the file in the repository (relative to OUTDIR's source tree is meaningless), so they are shown as
code. Fails on a dangling link or anchor in the generated pages.
"""
import glob
import html
import os
import re
import shutil
import sys

out = sys.argv[1]
ROOT = os.getcwd()
pages = {"README.md": "index.html", "CHANGELOG.md": "changelog.html"}
for p in sorted(glob.glob("docs/*.md")):
    pages[p] = os.path.basename(p)[:-3] + ".html"
titles = {}


def slug(h):
    s = re.sub(r"[^\w\- ]", "", re.sub(r"<[^>]+>", "", h).strip().lower())
    return s.replace(" ", "-")


def href(target, src):
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        return target
    file, _, anchor = target.partition("#")
    path = os.path.normpath(os.path.join(os.path.dirname(src), file))
    if path in pages:
        return pages[path] + ("#" + anchor if anchor else "")
    if os.path.exists(path) and path.startswith("docs/") and not path.endswith(".md"):
        return os.path.basename(path)  # a plot next to its page
    return "MISSING:" + target


def inline(t, src):
    parts = re.split(r"(`[^`]+`)", t)
    o = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) > 1:
            o.append("<code>" + html.escape(p[1:-1]) + "</code>")
            continue
        p = html.escape(p, quote=False)
        p = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", lambda m: f'<img alt="{m.group(1)}" src="{href(m.group(2), src)}">', p)
        p = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", lambda m: f'<a href="{href(m.group(2), src)}">{m.group(1)}</a>', p)
        o.append(p)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", "".join(o))


def convert(src):
    ls = open(src, encoding="utf-8").read().split("\n")
    o, i, para = [], 0, []

    def flush():
        if para:
            o.append("<p>" + inline(" ".join(para), src) + "</p>")
            para.clear()
    while i < len(ls):
        l = ls[i]
        if l.startswith("```"):
            flush()
            lang = l[3:].strip()
            j = i + 1
            while j < len(ls) and not ls[j].startswith("```"):
                j += 1
            o.append(f'<pre class="{lang}"><code>' + html.escape("\n".join(ls[i + 1:j])) + "</code></pre>")
            i = j + 1
            continue
        if l.startswith("<!--"):
            flush()
            i += 1
            continue
        m = re.match(r"^(#{1,6}) (.*)$", l)
        if m:
            flush()
            n, text = len(m.group(1)), m.group(2)
            titles.setdefault(src, re.sub(r"`", "", text))
            o.append(f'<h{n} id="{slug(text)}">{inline(text, src)}</h{n}>')
            i += 1
            continue
        if l.startswith("|") and i + 1 < len(ls) and re.match(r"^\|[-:| ]+\|$", ls[i + 1]):
            flush()
            def cells(row):
                row = row.strip()[1:-1]
                return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]
            al = ["right" if c.strip().endswith(":") else "left" for c in cells(ls[i + 1])]
            o.append("<table><thead><tr>" + "".join(f'<th style="text-align:{a}">{inline(c, src)}</th>' for c, a in zip(cells(l), al)) + "</tr></thead><tbody>")
            i += 2
            while i < len(ls) and ls[i].startswith("|"):
                o.append("<tr>" + "".join(f'<td style="text-align:{a}">{inline(c, src)}</td>' for c, a in zip(cells(ls[i]), al)) + "</tr>")
                i += 1
            o.append("</tbody></table>")
            continue
        m = re.match(r"^(\s*)([-*]|\d+\.) (.*)$", l)
        if m:
            flush()
            stack = []  # indents of open lists
            while i < len(ls):
                m = re.match(r"^(\s*)([-*]|\d+\.) (.*)$", ls[i])
                if m:
                    ind = len(m.group(1))
                    if not stack or ind > stack[-1]:
                        o.append("<ul>")
                        stack.append(ind)
                    else:
                        while stack and ind < stack[-1]:
                            o.append("</li></ul>")
                            stack.pop()
                        o.append("</li>")
                    item = [m.group(3)]
                    i += 1
                    while i < len(ls) and ls[i].strip() and not re.match(r"^\s*([-*]|\d+\.) ", ls[i]) and ls[i].startswith(" "):
                        item.append(ls[i].strip())
                        i += 1
                    o.append("<li>" + inline(" ".join(item), src))
                    continue
                break
            while stack:
                o.append("</li></ul>")
                stack.pop()
            continue
        if not l.strip():
            flush()
        elif re.match(r"^<a id=", l):
            flush()
            o.append(l)
        else:
            para.append(l.strip())
        i += 1
    flush()
    return "\n".join(o)


CSS = """body{font-family:sans-serif;max-width:62em;margin:0 auto;padding:0 1em 3em;line-height:1.45;color:#222}
nav{border-bottom:1px solid #ccc;padding:.6em 0;margin-bottom:1em;font-size:.92em}nav a{margin-right:.8em}
code{background:#f3f3f3;padding:0 .2em;border-radius:3px;font-size:.92em}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;border:1px solid #e1e4e8;border-radius:4px}pre code{background:none;padding:0}
table{border-collapse:collapse;margin:1em 0;font-size:.9em;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.3em .5em;vertical-align:top}th{background:#f0f0f0}
img{max-width:100%}h1,h2,h3{line-height:1.2}"""

os.makedirs(out, exist_ok=True)
bodies = {src: convert(src) for src in pages}
nav_order = ["README.md", "docs/handles-and-lifetimes.md", "docs/errors.md", "docs/connecting.md",
             "docs/completions.md", "docs/asio.md", "docs/grants.md", "docs/request-grants.md",
             "docs/indirect-keys.md", "docs/rereg.md", "docs/devices.md", "docs/performance.md",
             "docs/install.md", "docs/examples.md", "docs/dev.md", "CHANGELOG.md"]
short = {"README.md": "Home"}
nav = " ".join(f'<a href="{pages[p]}">{html.escape(short.get(p, titles.get(p, p).split(":")[0].split("(")[0].strip()))}</a>'
               for p in nav_order if p in pages) + ' <a href="reference/index.html"><strong>API reference</strong></a>'
for src, body in bodies.items():
    title = titles.get(src, src)
    with open(os.path.join(out, pages[src]), "w", encoding="utf-8") as f:
        f.write(f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} - rdmaxx</title>'
                f'<style>{CSS}</style></head><body><nav>{nav}</nav>\n{body}\n</body></html>\n')
for svg in glob.glob("docs/*.svg"):
    shutil.copy(svg, out)

# Link check over the pages (the reference is Doxygen's own and checked by its warnings).
bad = 0
ids = {}
for name in glob.glob(os.path.join(out, "*.html")):
    ids[os.path.basename(name)] = set(re.findall(r'id="([^"]+)"', open(name, encoding="utf-8").read()))
for name in sorted(glob.glob(os.path.join(out, "*.html"))):
    text = open(name, encoding="utf-8").read()
    for t in re.findall(r'(?:href|src)="([^"]+)"', text):
        if re.match(r"^[a-z]+:", t) and not t.startswith("MISSING:"):
            continue
        file, _, anchor = t.partition("#")
        file = file or os.path.basename(name)
        if t.startswith("MISSING:") or not os.path.exists(os.path.join(out, file)):
            print(f"{name}: dangling link {t.replace('MISSING:', '')}", file=sys.stderr)
            bad += 1
        elif anchor and file.endswith(".html") and file in ids and anchor not in ids[file]:
            print(f"{name}: dangling anchor {t}", file=sys.stderr)
            bad += 1
print(f"tools/docs: site: {len(bodies)} pages in {out}" + (f", {bad} dangling link(s)" if bad else ", no dangling link"))
sys.exit(1 if bad else 0)
