#!/usr/bin/env python3
"""bench/compile/measure.py: the compile cost of rdmaxx's headers in a user's build (issue #44).

Each row is a translation unit that includes one rdmaxx header, against its baseline TU (what a
program written on the C API alone includes). Each TU is compiled with
`CXX -std=c++20 -O2 -fsyntax-only -Iinclude -DRDMAXX_HAVE_MLX5=M` (M = 1 when mlx5dv.h is there,
as the Meson build does); the time is CPU seconds (user + sys of the compiler and its children,
from wait4), not wall time, since the machine may be shared. Runs are interleaved (every TU once
per round, then the next round), the median of the rounds is reported, with the range.

Usage: bench/compile/measure.py [--rounds N] [--cxx g++,clang++] [--rows a,b] [--json FILE]
Appends one record per (compiler, row) to FILE (a JSON list; default bench/results/compile-time.json,
the raw compile times) and, unless --json is "-", one record per (compiler, row) to
bench/results/records.json through bench/record.py (goal compile-time: the ratio, its range over
the rounds, every round's ratio), which `tools/bench render` shows on docs/performance.md.
"""
import argparse, datetime, json, os, re, statistics, subprocess, sys, tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = "bench/compile"
BASE = f"{HERE}/baseline_minimal.cpp"
BASE_ASIO = f"{HERE}/baseline_asio.cpp"
# row name -> (TU, baseline TU); a TU named "<rdmaxx/x.hpp>" is one line including that header.
ROWS = {
    "memory_region.hpp": ("<rdmaxx/memory_region.hpp>", BASE),
    "rdmaxx.hpp": (f"{HERE}/with_rdmaxx.cpp", BASE),
    "asio.hpp": ("<rdmaxx/asio.hpp>", BASE_ASIO),
}


def cpu_seconds(cmd):
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"measure.py: {' '.join(cmd)} failed:\n{err.decode()}")
    return ru.ru_utime + ru.ru_stime


def compiles(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cxx", default="g++-12,clang++-14")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--json", default=os.path.join(ROOT, "bench/results/compile-time.json"))
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    mlx5 = 1 if os.path.exists("/usr/include/infiniband/mlx5dv.h") else 0
    flags = ["-std=c++20", "-O2", "-fsyntax-only", "-Iinclude", f"-DRDMAXX_HAVE_MLX5={mlx5}"]
    tmp = tempfile.mkdtemp(prefix="rdmaxx-compile.")
    def tu_path(tu):
        if not tu.startswith("<"):
            return tu
        p = os.path.join(tmp, tu.strip("<>").replace("/", "_") + ".cpp")
        with open(p, "w") as f:
            f.write(f"#include {tu}\n")
        return p
    rows = a.rows.split(",")
    # A row a compiler cannot build is left out for that compiler and said so (clang 14 with
    # Boost 1.74: Boost.Asio sees no co_await support, and asio.hpp refuses to build).
    plan = {}
    for cxx in a.cxx.split(","):
        plan[cxx] = []
        for r in rows:
            if all(compiles([cxx, *flags, tu_path(t)]) for t in ROWS[r]):
                plan[cxx].append(r)
            else:
                print(f"{cxx:12} {r:20} skipped: the TU or its baseline does not compile")
    times = {}
    for _ in range(a.rounds):
        for cxx in a.cxx.split(","):
            for t in sorted({t for r in plan[cxx] for t in ROWS[r]}):
                times.setdefault((cxx, t), []).append(cpu_seconds([cxx, *flags, tu_path(t)]))
            # A/A: each baseline a second time, last in the round (the ratio an unchanged TU gets).
            for t in sorted({ROWS[r][1] for r in plan[cxx]}):
                times.setdefault((cxx, t + "#again"), []).append(cpu_seconds([cxx, *flags, tu_path(t)]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "include"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip() != ""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import record
    run = record.Run("tools/bench compile " + " ".join(sys.argv[1:]), started, load_before,
                     kernel=os.uname().release + " (host)", flags=" ".join(flags),
                     machine=f"{os.uname().machine}, {os.cpu_count()} cores (the host: no VM)",
                     source="bench/compile/measure.py")
    records = []
    for cxx in a.cxx.split(","):
        ver = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        for r in plan[cxx]:
            tu, base = ROWS[r]
            tr, tb = times[(cxx, tu)], times[(cxx, base)]
            rec = {
                "benchmark": f"compile time: {r} vs its baseline",
                "commit": commit + ("+dirty" if dirty else ""),
                "date": date,
                "host": {"cores": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in load]},
                "compiler": ver, "flags": flags,
                "command": f"{cxx} {' '.join(flags)} TU",
                "tu": tu, "baseline_tu": base,
                "unit": "CPU seconds (user+sys)",
                "rdmaxx": [round(x, 3) for x in tr], "baseline": [round(x, 3) for x in tb],
                "median_rdmaxx": round(statistics.median(tr), 3),
                "median_baseline": round(statistics.median(tb), 3),
                "ratio": round(statistics.median(tr) / statistics.median(tb), 3),
                "note": a.note,
            }
            records.append(rec)
            per_round = [round(x / y, 3) for x, y in zip(tr, tb)]
            aa = [round(x / y, 3) for x, y in zip(times[(cxx, base + "#again")], tb)]
            m = re.search(r"(\d+)\.\d+\.\d+", ver)
            label = ("clang " if "clang" in ver else "g++ ") + (m.group(1) if m else "?")
            run.add("compile-time", f"{r}: CPU time of a TU including it / its baseline TU, {label}",
                    "ratio", rec["ratio"], spread=[min(per_round), max(per_round)], values=per_round,
                    aa={"value": round(statistics.median(aa), 3), "values": aa,
                        "what": "the baseline TU again / the baseline TU, in the same rounds"},
                    peers={"rdmaxx s": rec["median_rdmaxx"], "baseline s": rec["median_baseline"],
                           "baseline TU": base},
                    compiler=ver, note=f"{a.rounds} interleaved rounds; values: each round's ratio"
                    + (f"; {a.note}" if a.note else ""))
            print(f"{cxx:12} {r:20} rdmaxx {rec['median_rdmaxx']:.3f} [{min(tr):.2f}-{max(tr):.2f}]"
                  f"  base {rec['median_baseline']:.3f} [{min(tb):.2f}-{max(tb):.2f}]  ratio {rec['ratio']:.2f}x")
    if a.json != "-":
        old = json.load(open(a.json)) if os.path.exists(a.json) else []
        json.dump(old + records, open(a.json, "w"), indent=1)
        print(f"appended {len(records)} records to {os.path.relpath(a.json, ROOT)}")
        cwd = os.getcwd()
        os.chdir(ROOT)  # record.py writes bench/results/records.json relative to the project
        try:
            run.append()
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    main()
