#!/usr/bin/env python3
"""bench/plot_scale.py: the plot of bench/results/scale.json (tools/bench scale) as an SVG.

Python 3's standard library only (the SVG is written by hand). Run by hand, never in CI:
    python3 bench/plot_scale.py [bench/results/scale.json] [bench/results/scale.svg]
Six panels, log2 x axes: as connections grow (own resources, shared PD+CQ, and shared PD+CQ with
one shared rdma_cm channel per end: mode "shared+channel"), per-connection file
descriptors and kernel objects, setup time per connection, request throughput and latency; as
pool slots grow on one connection, pool setup time and pinned memory per slot.
"""
import json
import math
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "bench/results/scale.json"
dst = sys.argv[2] if len(sys.argv) > 2 else "bench/results/scale.svg"
doc = json.load(open(src))
rows = doc["rows"]  # the medians of the runs (tools/bench scale)

W, H = 1450, 760
PW, PH = 360, 250  # plot area of a panel
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def conns(mode, key):
    rs = sorted((r for r in rows if r.get("sweep") == "conns" and r.get("mode") == mode
                 and r.get("ends") == "both" and r.get("vms", 1) == 1 and not r.get("error")),
                key=lambda r: r["connections"])
    return [(r["connections"], r[key]) for r in rs]


def slots(key, per_slot=False):
    rs = sorted((r for r in rows if r.get("sweep") == "slots" and not r.get("error")), key=lambda r: r["slots"])
    return [(r["slots"], r[key] / (r["slots"] if per_slot else 1)) for r in rs]


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(x0, y0, title, xlabel, ylabel, series):
    out = []
    pts = [p for _, s in series for p in s]
    if not pts:
        return out
    xs = [math.log2(x) for x, _ in pts]
    xmin, xmax = min(xs), max(xs)
    if xmax == xmin:
        xmax = xmin + 1
    ymax = max(y for _, y in pts) or 1
    # A round upper bound: 1, 2 or 5 times a power of ten.
    mag = 10 ** math.floor(math.log10(ymax))
    ytop = next(m * mag for m in (1, 2, 5, 10) if m * mag >= ymax)

    def X(x):
        return x0 + (math.log2(x) - xmin) / (xmax - xmin) * PW

    def Y(y):
        return y0 + PH - y / ytop * PH

    out.append(f'<text x="{x0 + PW / 2}" y="{y0 - 12}" text-anchor="middle" font-weight="bold">{esc(title)}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#888"/>')
    for i in range(5):
        yv = ytop * i / 4
        out.append(f'<line x1="{x0}" y1="{Y(yv):.1f}" x2="{x0 + PW}" y2="{Y(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{Y(yv) + 4:.1f}" text-anchor="end" font-size="11">{yv:g}</text>')
    for e in range(int(math.floor(xmin)), int(math.ceil(xmax)) + 1):
        xv = 2 ** e
        if xmin - 1e-9 <= e <= xmax + 1e-9 and (e % 2 == 0 or xmax - xmin <= 8):
            out.append(f'<line x1="{X(xv):.1f}" y1="{y0}" x2="{X(xv):.1f}" y2="{y0 + PH}" stroke="#eee"/>')
            out.append(f'<text x="{X(xv):.1f}" y="{y0 + PH + 15}" text-anchor="middle" font-size="11">{xv:g}</text>')
    out.append(f'<text x="{x0 + PW / 2}" y="{y0 + PH + 32}" text-anchor="middle" font-size="12">{esc(xlabel)}</text>')
    out.append(f'<text x="{x0 - 45}" y="{y0 + PH / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 45} {y0 + PH / 2})">{esc(ylabel)}</text>')
    for i, (name, s) in enumerate(series):
        if not s:
            continue
        c = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="5,3"' if "shared" in name else ""
        path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for x, y in s:
            out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="{c}"/>')
        ly = y0 + 14 + 15 * i
        out.append(f'<line x1="{x0 + 10}" y1="{ly - 4}" x2="{x0 + 30}" y2="{ly - 4}" stroke="{c}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{x0 + 35}" y="{ly}" font-size="11">{esc(name)}</text>')
    return out


parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">rdmaxx: how cost grows '
         f'({esc(doc.get("command", "tools/bench scale"))}, {esc(doc.get("date", ""))})</text>']
def total(mode, keys):
    cols = [conns(mode, k) for k in keys]
    return [(c[0][0], sum(y for _, y in c)) for c in zip(*cols)]


parts += panel(80, 60, "per connection (both ends): fds, kernel objects", "connections", "per connection", [
    ("fds, own", conns("own", "fds_per_conn")),
    ("fds, shared PD+CQ", conns("shared", "fds_per_conn")),
    ("fds, shared PD+CQ+cm channel", conns("shared+channel", "fds_per_conn")),
    ("ctx+pd+cq, own", total("own", ("ctx_per_conn", "pd_per_conn", "cq_per_conn"))),
    ("ctx+pd+cq, shared PD+CQ", total("shared", ("ctx_per_conn", "pd_per_conn", "cq_per_conn"))),
])
parts += panel(560, 60, "setup time per connection (connect+accept+pool)", "connections", "ms", [
    ("own", conns("own", "setup_ms_per_conn")),
    ("shared PD+CQ", conns("shared", "setup_ms_per_conn")),
    ("shared PD+CQ+cm channel", conns("shared+channel", "setup_ms_per_conn")),
])
parts += panel(1040, 60, "requests/s (one in flight per connection)", "connections", "requests/s", [
    ("all connections, own", conns("own", "requests_per_s")),
    ("all connections, shared PD+CQ", conns("shared", "requests_per_s")),
    ("all connections, shared PD+CQ+cm channel", conns("shared+channel", "requests_per_s")),
    ("per connection, own", conns("own", "requests_per_s_per_conn")),
    ("per connection, shared PD+CQ", conns("shared", "requests_per_s_per_conn")),
    ("per connection, shared PD+CQ+cm channel", conns("shared+channel", "requests_per_s_per_conn")),
])
parts += panel(80, 440, "request latency (post to revoke confirmed)", "connections", "ms", [
    ("p50, own", [(x, y / 1000) for x, y in conns("own", "p50_us")]),
    ("p50, shared PD+CQ", [(x, y / 1000) for x, y in conns("shared", "p50_us")]),
    ("p99, own", [(x, y / 1000) for x, y in conns("own", "p99_us")]),
    ("p99, shared PD+CQ", [(x, y / 1000) for x, y in conns("shared", "p99_us")]),
    ("p50, shared PD+CQ+cm channel", [(x, y / 1000) for x, y in conns("shared+channel", "p50_us")]),
    ("p99, shared PD+CQ+cm channel", [(x, y / 1000) for x, y in conns("shared+channel", "p99_us")]),
])
parts += panel(560, 440, "one connection: pool setup per slot", "slots", "µs per slot", [
    ("GrantPool::create µs per slot", [(x, y * 1000) for x, y in slots("pool_ms_per_conn", True)]),
])
parts += panel(1040, 440, "one connection: pinned memory and MRs per slot", "slots", "per slot", [
    ("pinned kB per 4 KiB slot", slots("vmpin_kb_per_conn", True)),
    ("MRs per slot", slots("mr_per_conn", True)),
])
parts.append("</svg>")
open(dst, "w").write("\n".join(parts) + "\n")
print(f"wrote {dst}")
