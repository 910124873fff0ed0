#!/bin/bash
# Throughput of examples 06 and 07 (rdmaxx/asio.hpp) in one boot, server and client on this host,
# no stalls, 3 interleaved runs: tools/rxe-vm bench/block_rpc_compare.sh BUILD_DIR (README: "On a
# Boost.Asio event loop").
build=${1:-build}
ip=192.0.2.1 # tools/rxe-vm gives the device this address
N=${N:-1000}
run() { # name port server-cmd client-args...
  local name=$1 port=$2 exe=$3; shift 3
  $exe server $port > /tmp/srv.log 2>&1 & local sp=$!
  sleep 1
  local t0=$(date +%s%N)
  $exe client $ip:$port "$@" > /tmp/cli.log 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N)-t0)/1000000 ))
  wait $sp; local src=$?
  echo "$name: client rc=$rc server rc=$src $ms ms for $N requests + 8 read-backs: $(( (N+8)*1000/ms )) req/s"
  grep -h "requests done\|FAIL" /tmp/cli.log /tmp/srv.log
}
for rep in 1 2 3; do
  run "06 (1 connection)" $((7480+rep*10)) $build/examples/06_block_rpc --requests $N
  run "07 --connections 1" $((7481+rep*10)) $build/examples/07_asio_block_rpc --requests $N --connections 1
  run "07 --connections 4" $((7482+rep*10)) $build/examples/07_asio_block_rpc --requests $N --connections 4
done
