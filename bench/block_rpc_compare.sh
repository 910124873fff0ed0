#!/bin/bash
# Throughput of examples 06 and 07 (rdmaxx/asio.hpp) in one boot, server and client on this host,
# no stalls, REPS interleaved runs (default 5): tools/rxe-vm bench/block_rpc_compare.sh BUILD_DIR
# (README: "On a Boost.Asio event loop"); N, REPS, STRACE through env: tools/rxe-vm env N=5000
# bench/block_rpc_compare.sh build. With STRACE=1, one run of each under strace -c -f
# instead: the system calls of server and client (the calls per request are load-independent).
build=${1:-build}
ip=192.0.2.1 # tools/rxe-vm gives the device this address
N=${N:-1000}
REPS=${REPS:-5}
run() { # name port exe client-args...
  local name=$1 port=$2 exe=$3; shift 3
  local pre_s=() pre_c=()
  if [ -n "$STRACE" ]; then pre_s=(strace -f -c -o /tmp/s.$port); pre_c=(strace -f -c -o /tmp/c.$port); fi
  "${pre_s[@]}" $exe server $port > /tmp/srv.log 2>&1 & local sp=$!
  sleep 1
  local t0=$(date +%s%N)
  "${pre_c[@]}" $exe client $ip:$port "$@" > /tmp/cli.log 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N)-t0)/1000000 ))
  wait $sp; local src=$?
  echo "$name: client rc=$rc server rc=$src $ms ms for $N requests + 8 read-backs: $(( (N+8)*1000/ms )) req/s"
  grep -h "router:\|FAIL" /tmp/cli.log /tmp/srv.log; grep -ho "steady state: .*" /tmp/cli.log
  if [ -n "$STRACE" ]; then
    for side in s c; do
      local who=server; [ $side = c ] && who=client
      echo "  $name $who system calls per request (start-up included):" \
        $(awk -v n=$((N+8)) '$NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $4 ~ /^[0-9]+$/ && $4 > n/4 {printf "%s %.2f, ", $NF, $4/n}
              /^100.00/ {printf "total %.2f", $4/n}' /tmp/$side.$port)
    done
  fi
}
[ -n "$STRACE" ] && REPS=1
for rep in $(seq $REPS); do
  run "06 (1 connection)" $((7480+rep*10)) $build/examples/06_block_rpc --requests $N
  run "07 --connections 1" $((7481+rep*10)) $build/examples/07_asio_block_rpc --requests $N --connections 1
  [ -n "$STRACE" ] || run "07 --connections 4" $((7482+rep*10)) $build/examples/07_asio_block_rpc --requests $N --connections 4
done
