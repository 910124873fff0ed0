#!/bin/bash
# Throughput of examples 06 and 07 (rdmaxx/asio.hpp) in one boot, server and client on this host,
# no stalls, REPS interleaved runs (default 5): tools/rxe-vm bench/block_rpc_compare.sh BUILD_DIR
# (tools/bench asio records it; docs/performance.md); N, REPS, STRACE, BASE, CALLGRIND, RATES_OUT through env:
# tools/rxe-vm env N=5000 bench/block_rpc_compare.sh build. The last lines: each program's median
# and range, and its rate over 06's round by round (runs that failed their checks left out): once
# from the wall time (process start, connection and teardown included), once from the client's
# own rate of its request loop (both examples print it: "requests done in S s (R requests/s").
# - STRACE=1: one run of each under strace -c -f instead: the system calls of server and client
#   (the calls per request are load-independent).
# - BASE=DIR: also DIR/examples/07_asio_block_rpc --connections 1 and DIR/examples/06_block_rpc
#   in every round (a build before a change, measured in the same boot; DIR inside the worktree:
#   the VM sees the host's /tmp only through RXE_VM_WRITABLE). NO4=1: without the 4-connection runs
#   (07 --connections 4, and 06 x 4: four 06 servers and their clients at once).
# - CALLGRIND=OUT: instead, user-space instructions per request of 06 and 07 --connections 1
#   (both sides under callgrind, N1=200 and N2=400 requests, start-up cancelled by the
#   difference), files in OUT (writable: RXE_VM_WRITABLE=OUT tools/rxe-vm env CALLGRIND=OUT ...);
#   then on the host: callgrind_annotate OUT/07.c.400.cg (per function). CG_ONLY="07 ...": only
#   those of 06, 07 and 07-base (BASE).
# Each run prints the CPU (user+system, bash time) per request of server and client.
# - MIX=1: also 06's client against 07's server ("mix-s07") and 07's client (--connections 1)
#   against 06's server ("mix-s06") in every round (the same wire): what each side costs alone.
# - AA=1: 06 a second time in every round ("06-again"): the ratio an unchanged program gets.
# - The programs' order turns by one each round (ORDER=fixed keeps it).
# - PIN=1: the server on the guest's CPU 0, the client on CPU 1 (taskset), every program alike:
#   no run gains or loses by where the guest's scheduler placed the two.
# - SHIM=1: also 06 under bench/poll_epoll_ctl.cpp (LD_PRELOAD: one epoll_ctl before each
#   poll, the call Asio's reactor makes per fd wait) in every round: "06-ctl". SHIM_EPOLL=1: 06
#   whose waits sleep in that epoll set's epoll_wait, as Asio's reactor does ("06-epoll").
#   SHIM_SPIN=N: 06 with N empty rounds (2N instructions) after each wake-up ("06-spin").
build=${1:-build}
ip=192.0.2.1 # tools/rxe-vm gives the device this address
N=${N:-1000}
REPS=${REPS:-5}
if [ -n "$CALLGRIND" ]; then
  N1=${N1:-200} N2=${N2:-400} port=7600
  for p in "06 $build/examples/06_block_rpc" "07 $build/examples/07_asio_block_rpc --connections 1" \
           ${BASE:+"07-base $BASE/examples/07_asio_block_rpc --connections 1"}; do
    read -r name exe extra <<<"$p"
    [[ " ${CG_ONLY:-$name} " == *" $name "* ]] || continue
    declare -A total=()
    for n in $N1 $N2; do
      # A run whose checks failed (a request past its timeout while valgrind translates the
      # first requests' code on a loaded host: a reconnect is counted in) is run again.
      for attempt in 1 2 3; do
        port=$((port + 1))
        for side in s c; do rm -f "$CALLGRIND/$name.$side.$n.cg"; done
        LD_BIND_NOW=1 valgrind --tool=callgrind --callgrind-out-file="$CALLGRIND/$name.s.$n.cg" \
          "$exe" server $port >"$CALLGRIND/$name.s.$n.log" 2>"$CALLGRIND/$name.s.$n.vg" & sp=$!
        for _ in $(seq 600); do grep -q listening "$CALLGRIND/$name.s.$n.log" 2>/dev/null && break; sleep 0.1; done
        # shellcheck disable=SC2086 # $extra: the client's extra arguments
        LD_BIND_NOW=1 valgrind --tool=callgrind --callgrind-out-file="$CALLGRIND/$name.c.$n.cg" \
          "$exe" client $ip:$port --requests "$n" $extra >"$CALLGRIND/$name.c.$n.log" 2>"$CALLGRIND/$name.c.$n.vg"
        rc=$?; wait $sp; src=$?
        [ $rc = 0 ] && [ $src = 0 ] && break
        echo "$name N=$n attempt $attempt: client rc=$rc server rc=$src (see $CALLGRIND/$name.*.$n.log)"
      done
      for side in s c; do
        total[$side.$n]=$(sed -n 's/^summary: //p' "$CALLGRIND/$name.$side.$n.cg")
      done
    done
    for side in s c; do
      who=server; [ $side = c ] && who=client
      echo "$name $who: $(( (${total[$side.$N2]} - ${total[$side.$N1]}) / (N2 - N1) )) instructions per request" \
           "(${total[$side.$N1]} at N=$N1, ${total[$side.$N2]} at N=$N2)"
    done
    unset total
  done
  exit 0
fi
# loop_rate LOG...: the request loop's rate the clients of these logs printed ("done in S s (R
# requests/s"), summed over them (their loops overlap), in whole requests per second.
loop_rate() {
  cat "$@" | grep -o 'done in [0-9.]* s ([0-9.]* requests/s' | grep -o '[0-9.]* requests/s' |
    awk '{s += $1; n++} END {if (n) printf "%d", s}'
}
run() { # name key port exe client-args...
  local name=$1 key=$2 port=$3 exe=$4; shift 4
  local pre_s=() pre_c=()
  if [ -n "$STRACE" ]; then pre_s=(strace -f -c -o "/tmp/s.$port"); pre_c=(strace -f -c -o "/tmp/c.$port"); fi
  local pre=() pin_s=() pin_c=()
  [ -n "$PIN" ] && pin_s=(taskset -c 0) && pin_c=(taskset -c 1)
  local shim="$PWD/$build/bench/poll_epoll_ctl.so"
  [ "$key" = 06-ctl ] && pre=(env LD_PRELOAD="$shim")
  [ "$key" = 06-epoll ] && pre=(env LD_PRELOAD="$shim" RDMAXX_SHIM_WAIT=epoll)
  [ "$key" = 06-spin ] && pre=(env LD_PRELOAD="$shim" RDMAXX_SHIM_SPIN="$SHIM_SPIN")
  local TIMEFORMAT='%U %S' # bash's time: user and system CPU seconds of the process
  local sexe=${srv_exe:-$exe} # MIX: the other example's server
  { time "${pin_s[@]}" "${pre[@]}" "${pre_s[@]}" "$sexe" server "$port" > /tmp/srv.log 2>&1; } 2> /tmp/srv.time & local sp=$!
  sleep 1
  local t0
  t0=$(date +%s%N)
  { time "${pin_c[@]}" "${pre[@]}" "${pre_c[@]}" "$exe" client "$ip:$port" "$@" > /tmp/cli.log 2>&1; } 2> /tmp/cli.time; local rc=$?
  local ms=$(( ($(date +%s%N)-t0)/1000000 ))
  wait $sp; local src=$?
  echo "$name: client rc=$rc server rc=$src $ms ms for $N requests + 8 read-backs: $(( (N+8)*1000/ms )) req/s;" \
    "CPU us per request (user+system, start-up included): server $(awk -v n=$((N+8)) '{printf "%.0f+%.0f", $1*1e6/n, $2*1e6/n}' /tmp/srv.time)," \
    "client $(awk -v n=$((N+8)) '{printf "%.0f+%.0f", $1*1e6/n, $2*1e6/n}' /tmp/cli.time)"
  # The client's own rate of its request loop (connected, before the goodbye): without process
  # start, connection set-up and teardown, which the wall time above includes.
  local loop
  loop=$(loop_rate /tmp/cli.log)
  [ $rc = 0 ] && [ $src = 0 ] && [ -n "$loop" ] && loops+=("$rep $key $loop")
  [ $rc = 0 ] && [ $src = 0 ] && rates+=("$rep $key $(( (N+8)*1000/ms ))") &&
    cpu+=("$key $(awk -v n=$((N+8)) '{printf "%.0f ", ($1+$2)*1e6/n}' /tmp/srv.time /tmp/cli.time)")
  grep -h "router:\|FAIL\|broke its" /tmp/cli.log /tmp/srv.log; grep -ho "steady state: .*" /tmp/cli.log
  if [ -n "$STRACE" ]; then
    for side in s c; do
      local who=server; [ $side = c ] && who=client
      echo "  $name $who system calls per request (start-up included):" \
        "$(awk -v n=$((N+8)) '$NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $4 ~ /^[0-9]+$/ && $4 > n/50 {printf "%s %.2f, ", $NF, $4/n}
              /^100.00/ {printf "total %.2f", $4/n}' "/tmp/$side.$port")"
    done
  fi
}
# K copies of 06 at once, each a server and its client (one connection each, N/K requests + 8
# read-backs): the hand-written blocking loop's way to K concurrent connections (a process each),
# what 07 --connections K does on one thread per side. The rate: all requests over the wall time
# from the first client's start to the last client's end; the loop rate: the sum of the clients'
# own rates (their loops overlap).
run_pairs() { # name key port exe K
  local name=$1 key=$2 port=$3 exe=$4 k=$5 i p
  local pin_s=() pin_c=() sps=() cps=()
  [ -n "$PIN" ] && pin_s=(taskset -c 0) && pin_c=(taskset -c 1)
  for ((i = 0; i < k; i++)); do
    "${pin_s[@]}" "$exe" server $((port + i)) > /tmp/srv.$i.log 2>&1 &
    sps+=($!)
  done
  sleep 1
  local t0
  t0=$(date +%s%N)
  for ((i = 0; i < k; i++)); do
    "${pin_c[@]}" "$exe" client $ip:$((port + i)) --requests $((N / k)) > /tmp/cli.$i.log 2>&1 &
    cps+=($!)
  done
  local rc=0 src=0
  for p in "${cps[@]}"; do wait "$p" || rc=$?; done
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  for p in "${sps[@]}"; do wait "$p" || src=$?; done
  local all=$((k * (N / k + 8)))
  echo "$name: clients rc=$rc servers rc=$src $ms ms for $all requests (read-backs included): $((all * 1000 / ms)) req/s"
  local loop
  loop=$(loop_rate /tmp/cli.[0-9]*.log)
  [ $rc = 0 ] && [ $src = 0 ] && [ -n "$loop" ] && loops+=("$rep $key $loop")
  [ $rc = 0 ] && [ $src = 0 ] && rates+=("$rep $key $((all * 1000 / ms))")
  grep -h "FAIL" /tmp/cli.[0-9]*.log /tmp/srv.[0-9]*.log
  rm -f /tmp/cli.[0-9]*.log /tmp/srv.[0-9]*.log
}
[ -n "$STRACE" ] && REPS=1
rates=() # "round program req/s" of the runs that passed their checks (wall time, start-up included)
loops=() # "round program req/s" of the same runs: the client's request loop alone
cpu=()   # "program server-us client-us": CPU (user+system) per request of those runs
for rep in $(seq "$REPS"); do
  p=$((7480+rep*10))
  steps=("run '06 (1 connection)' 06 $p $build/examples/06_block_rpc --requests $N")
  [ -n "$AA" ] && steps+=("run '06 again (A/A: the noise floor)' 06-again $((p+8)) $build/examples/06_block_rpc --requests $N")
  [ -n "$SHIM" ] && steps+=("run '06 + epoll_ctl per poll (SHIM)' 06-ctl $((p+4)) $build/examples/06_block_rpc --requests $N")
  [ -n "$SHIM_EPOLL" ] && steps+=("run '06 waiting in epoll_wait (SHIM_EPOLL)' 06-epoll $((p+9)) $build/examples/06_block_rpc --requests $N")
  [ -n "$SHIM_SPIN" ] && steps+=("run '06 + $SHIM_SPIN empty rounds per wake-up (SHIM_SPIN)' 06-spin $((8780+rep*10)) $build/examples/06_block_rpc --requests $N")
  steps+=("run '07 --connections 1' 07-c1 $((p+1)) $build/examples/07_asio_block_rpc --requests $N --connections 1")
  [ -n "$BASE" ] && steps+=("run '07 of $BASE --connections 1' 07-base-c1 $((p+3)) $BASE/examples/07_asio_block_rpc --requests $N --connections 1")
  [ -n "$BASE" ] && steps+=("run '06 of $BASE (1 connection)' 06-base $((p+5)) $BASE/examples/06_block_rpc --requests $N")
  [ -n "$MIX" ] && steps+=("srv_exe=$build/examples/07_asio_block_rpc run '06 client, 07 server' mix-s07 $((p+6)) $build/examples/06_block_rpc --requests $N")
  [ -n "$MIX" ] && steps+=("srv_exe=$build/examples/06_block_rpc run '07 client, 06 server' mix-s06 $((p+7)) $build/examples/07_asio_block_rpc --requests $N --connections 1")
  [ -n "$STRACE" ] || [ -n "$NO4" ] || steps+=("run '07 --connections 4' 07-c4 $((p+2)) $build/examples/07_asio_block_rpc --requests $N --connections 4")
  [ -n "$STRACE" ] || [ -n "$NO4" ] || steps+=("run_pairs '06 x 4 (4 servers, 4 clients)' 06x4 $((8480+rep*10)) $build/examples/06_block_rpc 4")
  # The order turns by one program per round (ORDER=fixed: as listed). A program's place in the
  # round biased it: on 2026-12-03 an unchanged 06 run fourth of four gave 0.821 of 06 run first.
  off=0
  [ "${ORDER:-rotate}" = rotate ] && off=$(( (rep - 1) % ${#steps[@]} ))
  for ((i = 0; i < ${#steps[@]}; i++)); do eval "${steps[$(( (i + off) % ${#steps[@]} ))]}"; done
done
# Medians over the rounds, and each program / 06 round by round (rounds where both passed): of
# the wall-time rates, then of the request loop's rates.
summarize() {
  python3 -c '
import sys, statistics as st
r = {}
for line in sys.stdin:
    if line.strip():
        rep, name, v = line.split(); r.setdefault(name, {})[rep] = int(v)
for name, runs in r.items():
    v = sorted(runs.values())
    line = f"{name}: median {st.median(v):.0f} req/s ({v[0]}-{v[-1]}, {len(v)} runs)"
    # 07 with 4 connections is also compared with 06 x 4 (the same concurrency, a process each).
    for ref in ("06",) + (("06x4",) if name == "07-c4" else ()):
        pairs = sorted(runs[k] / r[ref][k] for k in runs if k in r.get(ref, {}))
        if name != ref and pairs:
            q = st.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
            line += (f"; / {ref} round by round: median {st.median(pairs):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f};"
                     f" {pairs[0]:.3f}-{pairs[-1]:.3f}, {len(pairs)} rounds)")
    print(line)
'
}
# RATES_OUT=FILE (writable in the VM): every run's rate, "wall|loop ROUND PROGRAM REQ/S" (tools/bench asio).
if [ -n "$RATES_OUT" ]; then
  printf 'wall %s\n' "${rates[@]}" >"$RATES_OUT"
  if ((${#loops[@]})); then printf 'loop %s\n' "${loops[@]}" >>"$RATES_OUT"; fi
fi
echo "Wall time (process start, connection and teardown included):"
printf '%s\n' "${rates[@]}" | summarize
if ((${#loops[@]})); then
  echo "The request loop alone (the client's own rate, connected, before the goodbye):"
  printf '%s\n' "${loops[@]}" | summarize
fi
printf '%s\n' "${cpu[@]}" | python3 -c '
import sys, statistics as st
c = {}
for line in sys.stdin:
    if line.strip():
        name, s, k = line.split(); c.setdefault(name, []).append((int(s), int(k)))
for name, v in c.items():
    print(f"{name}: CPU per request, median: server {st.median(x[0] for x in v):.0f} us, client {st.median(x[1] for x in v):.0f} us")
'
