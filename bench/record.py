#!/usr/bin/env python3
"""bench/record.py: one place that writes records to bench/results/records.json.

Every mode of tools/bench (the main run, fastpath-builds, scale) appends its figures through this
module, so that each record carries the same provenance (the schema is records.json's "schema"):
commit, date, host (machine, cores, load average before and after the run), kernel, compiler and
flags, the command, every repetition's values and where the figure came from.

  import record                                   # with bench/ on sys.path
  run = record.Run(command, started, load_before, kernel=..., compiler=..., flags=...)
  run.add(goal, name, unit, value, better=..., spread=..., values=..., peers=..., note=...)
  run.append()                                     # load_after and the commit are taken now

RDMAXX_RECORDS=PATH writes to PATH instead of bench/results/records.json (for trying a mode on
fake input without touching the project's records).
As a command: `record.py start` prints "DATE|LOAD" for a shell script to pass back to Run.
"""
import json
import os
import platform
import subprocess
import sys
import time

PATH = os.environ.get("RDMAXX_RECORDS", "bench/results/records.json")
MACHINE = f"{platform.machine()}, {os.cpu_count()} cores, rxe in a QEMU TCG guest"


def now():
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def commit():
    """HEAD's short hash, marked when include/ or bench/ (not bench/results/, what runs write) differ from it."""
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    c = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "include", "bench", ":!bench/results"):
        c += " (with uncommitted changes to include/ or bench/)"
    return c


def compiler_version(cxx):
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
        return out.split("\n")[0].strip() or "unknown"
    except OSError:
        return "unknown"


class Run:
    """The provenance one run shares among its records, and the records it made."""

    def __init__(self, command, started, load_before, *, kernel="unknown", compiler="unknown",
                 flags="unknown", machine=MACHINE, source=None):
        self.common = {"command": command, "date": started, "load_before": load_before,
                       "kernel": kernel, "compiler": compiler, "flags": flags,
                       "machine": machine, "source": source or command.split(" ")[0]}
        self.records = []

    def add(self, goal, name, unit, value, *, better="lower", spread=None, aa=None, peers=None,
            values="unknown", note=None, **override):
        """One figure. override: kernel, compiler, flags or source for this record only."""
        c = dict(self.common, **override)
        r = {"goal": goal, "name": name, "unit": unit, "value": value, "better": better,
             "spread": spread, "aa": aa, "peers": peers, "values": values,
             "commit": None, "recorded_in": None, "date": c["date"],
             "host": {"machine": c["machine"], "cores": os.cpu_count(),
                      "load_before": c["load_before"], "load_after": None},
             "kernel": c["kernel"], "compiler": c["compiler"], "flags": c["flags"],
             "command": c["command"], "source": c["source"]}
        if note:
            r["note"] = note
        self.records.append(r)
        return r

    def append(self, path=None, at=None):
        """Append this run's records (commit and load after the run filled in now). `at`: the
        commit measured, when that is not HEAD at the end (a run that cloned HEAD at its start)."""
        path = path or PATH
        head, after = at or commit(), loadavg()
        for r in self.records:
            r["commit"] = r["recorded_in"] = head
            r["host"]["load_after"] = after
        doc = json.load(open(path)) if os.path.exists(path) else {"schema": "see bench/record.py", "records": []}
        doc["records"] += self.records
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"bench/record.py: {len(self.records)} records appended to {path}")
        return len(self.records)


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        print(f"{now()}|{loadavg()}")
    else:
        print(__doc__)
        sys.exit(2)
