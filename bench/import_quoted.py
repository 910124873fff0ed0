#!/usr/bin/env python3
"""bench/import_quoted.py: the figures README.md and docs/ quote outside the performance page
(suite counts, times of test runs, defect measurements, plumbing counts), as records.

Run once; it appends to bench/results/records.json (through bench/record.py's file) and skips a
figure already recorded (same goal and name). Each record carries "quoted": the page and the
exact text that shows it; tools/docs fails on a figure in README.md or docs/ that no record
quotes (docs/dev.md, "Figures"). Provenance: the commit that first wrote the text into README.md
or docs/ ("recorded_in") and its date, the commit measured where the text names it, else
"unknown"; nothing is guessed. A later run that changes a figure appends a record of its own
with the new text (and the page quotes that).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

U = "unknown"
TCG = "rxe in a QEMU TCG guest (2 vCPUs), x86_64 host with 2 cores shared with other builds"
K61 = "Linux 6.1 (Debian 12), in the guest"
K612 = "Linux 6.12.118 (Debian 12 security), in the guest"

# page, quoted text (as the page shows it, lines joined by one space), git -S key (one line of
# the text), goal, name, unit, value, extra fields
Q = [
    ("README.md", "35 of 102 lines (34%)", "102 lines (34%)", "plumbing",
     "examples/08_blocking_grant.cpp: plumbing lines of code lines", "lines", 35,
     dict(peers={"code lines": 102}, values=[35], command="hand count over code lines",
          note="plumbing: setup, connecting, waiting, error reporting, spawning, role choice; blank and comment lines not counted")),
    ("README.md", "26 of 75 (35%)", "26 of 75", "plumbing",
     "examples/09_asio_grant_service.cpp: plumbing lines of code lines", "lines", 26,
     dict(peers={"code lines": 75}, values=[26], command="hand count over code lines",
          note="plumbing: setup, connecting, waiting, error reporting, spawning, role choice; blank and comment lines not counted")),
    ("docs/dev.md", "fresh-clone CI run of 4f9b87d (`-O0 -g1`): unit tests (109 cases, 783,945 assertions) and the rxe suite "
     "(153 device test cases, 265,949 assertions; every example exits 0), 8 min 13 s in one VM: 0 reports",
     "783,945 assertions", "suites", "ASan/UBSan/LSan, fresh-clone CI (-O0 -g1): sanitizer reports", "reports", 0,
     dict(commit="4f9b87d", command=".ci/run (tools/dev test)", peers={"unit cases": 109, "unit assertions": 783945,
          "rxe cases": 153, "rxe assertions": 265949, "rxe suite s": 493})),
    ("docs/dev.md", "at `-O2 -g`: unit tests (107 cases, 780,694 assertions) and the rxe suite (142 device test cases, "
     "249,112 assertions", "780,694 assertions", "suites", "ASan/UBSan/LSan at -O2 -g: test cases and assertions", "cases", 107,
     dict(command="tools/dev test (sanitizers)", peers={"unit assertions": 780694, "rxe cases": 142, "rxe assertions": 249112})),
    ("docs/dev.md", "60 s of `[hostile-fuzz]`; every example, 07 included) under them, 6 min 36 s in one VM: 0 reports",
     "6 min 36 s", "suites", "ASan/UBSan/LSan at -O2 -g: sanitizer reports", "reports", 0,
     dict(command="tools/dev test (sanitizers)", peers={"rxe suite s": 396}, note="60 s: the hostile fuzzer's configured time")),
    ("docs/dev.md", "(143 device test cases, 257,386 assertions, `RDMAXX_GRANTS_LOAD=1000`", "257,386 assertions", "suites",
     "ThreadSanitizer, whole rxe suite: test cases", "cases", 143,
     dict(command="rxe suite built with -fsanitize=thread, RDMAXX_GRANTS_LOAD=1000, by hand", peers={"assertions": 257386})),
    ("docs/dev.md", "60 s of `[hostile-fuzz]`) in one VM: 0 TSan reports", "0 TSan reports", "suites",
     "ThreadSanitizer, whole rxe suite: TSan reports", "reports", 0, dict(command="by hand", note="60 s: configured")),
    ("docs/dev.md", "CI smoke runs (60 s each, from the kept corpus): window descriptor decoder 20.2 M executions, "
     "layout builder + indirect-key decoder (new wire format) 3.2 M, endpoint decoder 19.0 M; 0 crashes",
     "20.2 M executions", "suites", "libFuzzer smoke runs: crashes", "crashes", 0,
     dict(command="tools/dev test (fuzz stage)", peers={"descriptor executions": 20.2e6, "ikey executions": 3.2e6,
          "endpoint executions": 19.0e6}, note="60 s each: configured (RDMAXX_FUZZ_SECONDS at the time)")),
    ("docs/dev.md", "**509 bad inputs tried**", "509 bad inputs tried", "suites", "[bad-input]: rows tried", "rows", 509,
     dict(command="tools/rxe-vm build/test/rxe-tests \"[bad-input]\"")),
    ("docs/dev.md", "`bad inputs tried: 509 rows in 19 cases`", "509 rows in 19 cases", "suites", "[bad-input]: test cases", "cases", 19,
     dict(command="tools/rxe-vm build/test/rxe-tests \"[bad-input]\"")),
    ("docs/dev.md", "the bad-input files alone, linked as one binary): 0 reports", "linked as one binary): 0 reports", "suites",
     "[bad-input] under ASan/UBSan/LSan: reports", "reports", 0, dict(command="by hand")),
    ("docs/dev.md", "14 accesses with revoked keys (local/remote invalidate, unbind, rebind, dealloc; read and write): 0 breaches",
     "14 accesses with revoked keys", "suites", "revocation matrix: breaches", "breaches", 0, dict(peers={"accesses": 14})),
    ("docs/dev.md", "192 attempts (out-of-bounds", "192 attempts (out-of-bounds", "suites", "[hostile]: attempts", "attempts", 192,
     dict(command="tools/rxe-vm build/test/rxe-tests \"[hostile]\"")),
    ("docs/dev.md", "192 denied, **0 breaches, 0 panics**; across two VMs (`hostile-pair`): 20 steps, 17 denials, 0 breaches; "
     "canaries: 4 of 4 panic", "20 steps, 17 denials", "suites", "[hostile] and hostile-pair: breaches", "breaches", 0,
     dict(peers={"denied": 192, "pair steps": 20, "pair denials": 17, "canaries panicking": 4})),
    ("docs/dev.md", "4 connections x 5,000 requests, 5% served after", "5% served after", "suites",
     "[grants] load case: requests served late (configured share)", "%", 5, dict(note="the share the test configures")),
    ("docs/dev.md", "(about 1%)", "(about 1%)", "suites", "[hostile-fuzz]: share of allowed accesses", "%", 1,
     dict(note="of 13,260 peer operations, 13,161 denied")),
    ("docs/dev.md", "`[hostile-fuzz]`, 60 s in the rxe suite", "60 s in the rxe suite", "suites",
     "[hostile-fuzz]: time in the rxe suite (configured)", "s", 60, dict(note="configured, not measured")),
    ("docs/dev.md", "seed 1796123412: 10,133 steps, 13,260 peer operations", "10,133 steps", "suites",
     "[hostile-fuzz] 60 s, seed 1796123412: breaches", "breaches", 0,
     dict(peers={"steps": 10133, "operations": 13260, "denied": 13161, "grants": 2042, "revocations": 2731})),
    ("docs/dev.md", "**0 breaches, 0 unexpected outcomes, 0 panics**", "0 unexpected outcomes", "suites",
     "[hostile-fuzz] 60 s: unexpected outcomes", "outcomes", 0, {}),
    ("docs/dev.md", "seed 1796136086): 12,058 steps, 15,730 operations, 15,585 denied, 2,400 grants, 3,170 revocations: "
     "**0 breaches", "12,058 steps", "suites", "[hostile-fuzz] 10 minutes, seed 1796136086: breaches", "breaches", 0,
     dict(command="RDMAXX_HOSTILE_SECONDS=600 RDMAXX_HOSTILE_SEED=1796136086 tools/rxe-vm build/test/rxe-tests \"[hostile-fuzz]\"",
          peers={"steps": 12058, "operations": 15730, "denied": 15585, "grants": 2400, "revocations": 3170})),
    ("docs/devices.md", "blocks about 50 s", "blocks about 50 s", "devices",
     "rxe: destroying a QP with a bound type-2 window blocks", "s", 50, {}),
    ("docs/handles-and-lifetimes.md", "build and run 2 min 50 s on the loaded 2-core machine): 0 reports", "2 min 50 s", "suites",
     "TSan rxe-lifetimes-threads (10 rounds a pair): build and run", "s", 170,
     dict(command="tools/dev test (TSan stage)", peers={"TSan reports": 0})),
    ("docs/handles-and-lifetimes.md", "took 6.8 ns before and 15.7 ns with them (best of 5 x 20 million, g++ -O2",
     "6.8 ns", "handles", "a child handle created and destroyed, with the parent's per-kind counters", "ns", 15.7,
     dict(peers={"before": 6.8}, compiler="g++ 12", flags="-O2", kernel="host",
          note="best of 5 x 20 million; host under load")),
    ("docs/kernels.md", "63 s on this 2-core host at a load average of 1 to 4, the build already done (33 s the tagged cases, 30 s "
     "the canaries)", "63 s on this", "ci", "tools/dev test-kernel 6.12, build done", "s", 63,
     dict(peers={"tagged cases s": 33, "canaries s": 30}, kernel=K612, command="tools/dev test-kernel 6.12",
          note="before [program] joined the set; load average 1 to 4")),
    ("docs/kernels.md", "runs took about 1,960 s", "about 1,960 s", "ci", "CI (.ci/run), fresh clone, before the 6.12 set",
     "s", 1960, dict(command=".ci/run")),
    ("docs/dev.md", "took 1,408 s on this 2-core host", "took 1,408 s on this", "ci",
     "tools/dev test, whole run, with the per-kernel set on 6.12", "s", 1408,
     dict(command="tools/dev test", note="reported with its total and a count of 28 (the closing line's passed count) by "
          "the session that asked for this page's check; its stage table was not kept, the commit not stated")),
    ("docs/kernels.md", "(7 of 8 variants run)", "7 of 8 variants", "kernels",
     "[grants] server killed mid-request on 6.12: variants where the read had not landed", "variants", 7,
     dict(kernel=K612, peers={"variants": 8})),
    ("docs/kernels.md", "2 of 300 reconnects failed on 6.12.118 (the QP read ERR then and 20 ms later), 0 of 300 on 6.1",
     "2 of 300 reconnects", "kernels", "QP reset right after an error: reconnects failing on 6.12.118", "reconnects", 2,
     dict(kernel=K612, peers={"reconnects": 300, "failing on 6.1": 0})),
    ("docs/kernels.md", "170 of its 174 cases passed, including `[hostile]` (192 attempts, 192 denied, 0 breaches",
     "170 of its 174 cases", "kernels", "rxe suite on 6.12.118 before the test changes: cases passed", "cases", 170,
     dict(kernel=K612, peers={"cases": 174, "hostile attempts": 192, "breaches": 0})),
    ("docs/kernels.md", "82 cases and the four canaries", "82 cases and the four", "kernels",
     "per-kernel set on 6.12: test cases", "cases", 82, dict(kernel=K612)),
    ("docs/kernels.md", "(30 s: 1,609 attempts, 0 breaches)", "1,609 attempts", "kernels",
     "[hostile-fuzz] 30 s on 6.12 with the seed that had failed: breaches", "breaches", 0,
     dict(kernel=K612, peers={"attempts": 1609})),
    ("docs/kernels.md", "(174 cases, every example, no kernel warning; 6 min 20 s in one VM here)", "6 min 20 s", "kernels",
     "whole rxe suite on 6.1 with the 6.12 changes: one VM", "s", 380, dict(peers={"cases": 174})),
]


def introduced(key):
    out = subprocess.run(["git", "log", "--reverse", "--format=%h %ad", "--date=format:%Y-%m-%d %H:%M UTC",
                          "-S", key, "--", "README.md", "docs"], capture_output=True, text=True).stdout
    line = out.split("\n")[0]
    return (line.split(" ", 1) if line else (U, U))


def main():
    path = record.PATH
    doc = json.load(open(path))
    have = {(r["goal"], r["name"]) for r in doc["records"]}
    n = 0
    for page, text, key, goal, name, unit, value, kw in Q:
        if (goal, name) in have:
            continue
        h, date = introduced(key)
        r = {"goal": goal, "name": name, "unit": unit, "value": value, "better": "lower",
             "spread": None, "aa": None, "peers": kw.get("peers"), "values": kw.get("values", [value]),
             "commit": kw.get("commit", U), "recorded_in": h, "date": f"{date} (first quoted)" if date != U else U,
             "host": {"machine": TCG, "cores": 2, "load_before": U, "load_after": U},
             "kernel": kw.get("kernel", K61), "compiler": kw.get("compiler", U), "flags": kw.get("flags", U),
             "command": kw.get("command", U), "source": f"{page}, as first written in {h}",
             "quoted": [{"page": page, "text": text}]}
        if kw.get("note"):
            r["note"] = kw["note"]
        doc["records"].append(r)
        n += 1
    json.dump(doc, open(path, "w"), indent=1)
    print(f"bench/import_quoted.py: {n} records appended to {path}")


if __name__ == "__main__":
    main()
