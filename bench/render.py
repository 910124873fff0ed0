#!/usr/bin/env python3
"""bench/render.py: docs/performance.md and its plots (docs/perf-*.svg) from bench/results/records.json.

Run through `tools/bench render`; `tools/docs` renders into a temporary directory and fails when
the committed page or a plot differs (a figure on the page that is not in the records). Python's
standard library only: the SVGs are written by hand.
Usage: render.py [OUTDIR]   (default docs/)
"""
import html
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "docs"
recs = json.load(open("bench/results/records.json"))["records"]

GOALS = [
    ("fast-path", "Fast path",
     "rdmaxx against raw rdma-core on the same objects. Instruction counts (callgrind in the VM, "
     "`--toggle-collect='*count_*'`) are exact and repeatable; timed rows (raw and rdmaxx "
     "interleaved, 11 repetitions, median ops/s) swing by 10-20% between runs of the same binary "
     "under TCG, so they show only that rdmaxx is not measurably slower. Goal: at most 1.01x raw "
     "instructions in every build users make."),
    ("grants", "Grants",
     "Time per grant cycle (grant 4 KiB, one 64-byte peer write, revoke), variants interleaved, "
     "11 x 300 cycles, each figure the median of the interleaved time ratios; a run's figures are "
     "the `values`, the median over runs is shown."),
    ("request-grants", "Request grants",
     "Per-request throughput of 4 KiB read-style requests on rxe loopback: the client grants its "
     "buffer, the server RDMA-reads it and replies, the client revokes; all arms interleaved in "
     "one run (`bench/bench_grant_pool`). (a) is the unprotected arm: one rkey for the whole pool, "
     "never revoked."),
    ("asio", "Asio",
     "Example 07 (Boost.Asio coroutines) against example 06 (a blocking loop) with the same wire "
     "and checks, server and client in one VM, round by round (`bench/block_rpc_compare.sh`, the "
     "order turned each round); A/A runs 06 twice per round and shows the ratio an unchanged "
     "program gets."),
    ("scale", "Scale",
     "`bench/bench_scale`: N connections over rdma_cm in one VM (client and server in one "
     "process), a `GrantPool` of 16 slots per client end, one request in flight per connection; "
     "counts per connection after the per-end shared resources; medians of the runs, spread = "
     "the runs' range. Nothing is compared here, so there is no A/A: the runs' range is the "
     "noise."),
    ("compile-time", "Compile time",
     "CPU seconds of one translation unit including an rdmaxx header against one including only "
     "what it wraps (`verbs.h`, Outcome's `std_result.hpp`, `<system_error>`; for `asio.hpp` also "
     "`boost/asio.hpp` and `rdma_cma.h`), `-std=c++20 -O2 -fsyntax-only`, 5 interleaved rounds on the "
     "host, the median ratio and the rounds' range (`tools/bench compile`); `tools/bench` also "
     "times a full `-O2 -c` of the umbrella. Goals: one handle header at most 1.5x, the umbrella "
     "2.0x, `asio.hpp` 1.2x."),
    ("ci", "CI and tools",
     "Wall-clock seconds on the 2-core development host (TCG: every VM run pays a boot)."),
]

METHOD = """All figures come from rxe (Soft-RoCE) in a QEMU TCG guest on a 2-core x86_64 host shared
with other builds, never from hardware: emulation makes time noisy and instruction counts exact.
Each row is one record of `bench/results/records.json`, with its commit, date, host load,
kernel, compiler, flags, command and every repetition; figures whose commit is not known (older
ones, imported from notes) stay in the records and are not shown. `tools/bench` and its modes
(`compile`, `scale`, `asio`, `ci`, `fastpath-builds`) append records; `tools/bench render` writes
this page and its plots; `tools/docs` fails when they differ from the records. A ratio below 1 favours
rdmaxx for time and instructions, above 1 for throughput (the `better` column)."""


def fmt(v):
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not v.is_integer():
            return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return f"{int(v):,}"
    return str(v)


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def latest(rs):
    """The newest record of each name, in the order first seen."""
    seen = {}
    for r in rs:
        seen[r["name"]] = r  # records are appended in time order
    return list(seen.values())


def short(name):
    """A plot label: the long common phrases of the names shortened (the table keeps them whole)."""
    for a, b in (("instructions per 64 B write as users build it: ", "users' build: "),
                 (" WR per batch", " WR/batch"), ("instructions per 64 B write", "instructions/write")):
        name = name.replace(a, b)
    return name


def svg_dots(rs, path, title):
    """Dot and whisker chart of each record's value (and spread)."""
    rs = [r for r in rs if isinstance(r["value"], (int, float))]
    if not rs:
        return False
    W, left, right, row = 1040, 560, 50, 22
    H = 60 + row * len(rs) + 30
    lo = min([r["value"] for r in rs] + [s for r in rs if r["spread"] for s in r["spread"]])
    hi = max([r["value"] for r in rs] + [s for r in rs if r["spread"] for s in r["spread"]])
    ratio = all("ratio" in r["unit"] or r["unit"] == "rdmaxx/raw" for r in rs)
    if ratio:
        lo, hi = min(lo, 1.0), max(hi, 1.0)
    lo = 0 if not ratio else lo
    pad = (hi - lo) * 0.05 or 0.05
    lo, hi = lo - (pad if ratio else 0), hi + pad
    import math
    logx = ratio and lo > 0 and hi / lo > 3
    if logx:
        X = lambda v: left + (W - left - right) * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7, 10) if lo <= t <= hi]
    else:
        X = lambda v: left + (W - left - right) * (v - lo) / (hi - lo)
        ticks = [lo + (hi - lo) * k / 5 for k in range(6)]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="10" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    y0, y1 = 40, 40 + row * len(rs)
    for v in ticks:
        o.append(f'<line x1="{X(v):.1f}" y1="{y0}" x2="{X(v):.1f}" y2="{y1}" stroke="#ddd"/>')
        o.append(f'<text x="{X(v):.1f}" y="{y1 + 16}" text-anchor="middle" fill="#444">{v:.3g}</text>')
    if ratio:
        o.append(f'<line x1="{X(1):.1f}" y1="{y0 - 4}" x2="{X(1):.1f}" y2="{y1}" stroke="#333" stroke-dasharray="4,3"/>')
    for i, r in enumerate(rs):
        y = y0 + row * i + row / 2
        name = short(r["name"])
        name = name if len(name) <= 86 else name[:83] + "..."
        o.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{html.escape(name)}</text>')
        if r["spread"]:
            a, b = r["spread"]
            o.append(f'<line x1="{X(a):.1f}" y1="{y}" x2="{X(b):.1f}" y2="{y}" stroke="#1f77b4" stroke-width="2"/>')
        if r.get("aa") and isinstance(r["aa"].get("value"), (int, float)):
            o.append(f'<circle cx="{X(r["aa"]["value"]):.1f}" cy="{y}" r="3.5" fill="none" stroke="#d62728"/>')
        o.append(f'<circle cx="{X(r["value"]):.1f}" cy="{y}" r="4.5" fill="#1f77b4"/>')
        o.append(f'<text x="{W - right + 4}" y="{y + 4}" fill="#444" font-size="10">{fmt(r["value"])}</text>')
    unit = rs[0]["unit"] if len({r["unit"] for r in rs}) == 1 else "value"
    o.append(f'<text x="{(left + W - right) / 2}" y="{H - 6}" text-anchor="middle" fill="#444">{html.escape(unit)}'
             + (' (log scale)' if logx else '') + (' (dashed: 1, parity; bar: spread; red ring: A/A)' if ratio else ' (bar: spread)') + '</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")
    return True


def svg_scale(rs, path):
    """requests/s of all connections against connections, one line per mode (log2 x)."""
    import math
    series = {}
    for r in rs:
        if not r["name"].endswith(": requests_per_s") or "connections:" not in r["name"] or "ulimit" in r["name"]:
            continue
        mode, n = r["name"].split(",")[0], int(r["name"].split(", ")[1].split()[0])
        series.setdefault(mode, []).append((n, r["value"], r["spread"]))
    if not series:
        return False
    W, H, L, R, T, B = 640, 360, 70, 150, 40, 50
    xs = [n for s in series.values() for n, _, _ in s]
    ys = [v for s in series.values() for _, v, sp in s] + [x for s in series.values() for _, _, sp in s if sp for x in sp]
    x0, x1, y1 = 0, math.log2(max(xs)), max(ys) * 1.08
    X = lambda n: L + (W - L - R) * (math.log2(n) - x0) / (x1 - x0 or 1)
    Y = lambda v: T + (H - T - B) * (1 - v / y1)
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         '<text x="10" y="22" font-size="15" font-weight="bold">Requests/s of all connections, as connections grow</text>']
    for k in range(6):
        v = y1 * k / 5
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end" fill="#444">{v:,.0f}</text>')
    for n in sorted(set(xs)):
        o.append(f'<text x="{X(n):.1f}" y="{H - B + 16}" text-anchor="middle" fill="#444">{n}</text>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle" fill="#444">connections (log scale)</text>')
    for i, (mode, pts) in enumerate(sorted(series.items())):
        pts.sort()
        c = colors[i % 3]
        o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (c, " ".join(f"{X(n):.1f},{Y(v):.1f}" for n, v, _ in pts)))
        for n, v, sp in pts:
            if sp:
                o.append(f'<line x1="{X(n):.1f}" y1="{Y(sp[0]):.1f}" x2="{X(n):.1f}" y2="{Y(sp[1]):.1f}" stroke="{c}" opacity="0.5"/>')
            o.append(f'<circle cx="{X(n):.1f}" cy="{Y(v):.1f}" r="3.5" fill="{c}"/>')
        o.append(f'<rect x="{W - R + 12}" y="{T + 18 * i}" width="12" height="12" fill="{c}"/>')
        o.append(f'<text x="{W - R + 30}" y="{T + 18 * i + 10}">{html.escape(mode)}</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")
    return True


md = ["<!-- Generated by `tools/bench render` from bench/results/records.json: do not edit. -->",
      "# Performance", "", METHOD, "",
      "Goals: " + " · ".join(f"[{t}](#{g if g != 'ci' else 'ci-and-tools'})" for g, t, _ in GOALS), ""]
for goal, title, method in GOALS:
    # Only figures measured at a known commit: the ones imported from the old README without one
    # stay in records.json (other pages quote some of them) but are not shown here.
    rs = [r for r in recs if r["goal"] == goal and r.get("commit") not in (None, "unknown")]
    if not rs:
        continue
    md += [f"## {title}", "", method, ""]
    cur = latest(rs)
    svg = f"perf-{goal}.svg"
    if goal == "scale":
        made = svg_scale(cur, os.path.join(out, svg))
        cur = [r for r in cur if "requests_per_s" in r["name"] or "fds_per_conn" in r["name"] or "ms pool" in r["unit"]]
    else:
        made = svg_dots(cur, os.path.join(out, svg), title)
    if made:
        md += [f"![{title}]({svg})", ""]
    md += ["| figure | value | unit | spread | A/A | compared with | commit | date | host load | values |",
           "|---|---:|---|---|---|---|---|---|---|---|"]
    for r in cur:
        sp = f"{fmt(r['spread'][0])} to {fmt(r['spread'][1])}" if r["spread"] else ""
        aa = fmt(r["aa"]["value"]) if r.get("aa") else ""
        peers = ", ".join(f"{k} {fmt(v)}" for k, v in r["peers"].items()) if r.get("peers") else ""
        h = r["host"]
        load = "" if h["load_before"] == "unknown" and h["load_after"] == "unknown" else f"{h['load_before']} / {h['load_after']}"
        vals = ", ".join(fmt(v) for v in r["values"]) if isinstance(r["values"], list) else r["values"]
        md.append("| " + " | ".join(cell(x) for x in (r["name"], fmt(r["value"]), r["unit"], sp, aa, peers,
                                                         r["commit"], r["date"], load or "unknown", vals)) + " |")
    md.append("")
open(os.path.join(out, "performance.md"), "w").write("\n".join(md).replace("\n\n\n", "\n\n"))
print(f"bench/render.py: {os.path.join(out, 'performance.md')} and its plots from {len(recs)} records")
