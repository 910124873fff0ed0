#!/usr/bin/env bash
# test/consumers/run.sh KIND SOURCE_ROOT BUILD_ROOT: build one consumer project of rdmaxx in a
# fresh temporary directory and run its program (no RDMA device needed). KIND:
#   meson-subproject  rdmaxx copied under subprojects/, dependency('rdmaxx') falls back to it
#   pkg-config        meson install --destdir, the staged tree deployed to its prefix, then a
#                     Makefile that uses `pkg-config rdmaxx`
#   cmake             meson install --destdir, then find_package(rdmaxx CONFIG) straight from
#                     the staging tree (the package config is relocatable); also checks that an
#                     incompatible version request is refused
# Offline (no downloads), -j1, the temporary directory is removed on exit (RDMAXX_KEEP_TMP=1
# keeps it). CXX selects the compiler (meson test passes the build's). BUILD_ROOT is the calling
# build directory; only its path is reported.
set -euo pipefail

if (($# != 3)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
kind=$1
src=$(cd "$2" && pwd)
build_root=$3
here=$(cd "$(dirname "$0")" && pwd)
export CXX=${CXX:-c++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdmaxx-consumer-$kind.XXXXXX")
cleanup() {
  if [[ ${RDMAXX_KEEP_TMP:-0} == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

say() { printf '== %s\n' "$*"; }
# run LOG CMD...: run quietly into $tmp/LOG; show the log if it fails.
run() {
  local log=$tmp/$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "FAILED: $*" >&2
    cat "$log" >&2
    return 1
  fi
}

# The rdmaxx source tree without VCS data and build directories (as a vendored copy would be).
copy_rdmaxx() {
  mkdir -p "$1"
  tar -C "$src" --exclude=./.git --exclude='./build*' -cf - . | tar -C "$1" -xf -
}

# stage_install PREFIX: configure rdmaxx (library only) for PREFIX and install it into
# $tmp/stage; fail if anything lands outside $tmp/stage/PREFIX.
stage_install() {
  local prefix=$1
  say "meson setup --prefix=$prefix; meson install --destdir $tmp/stage"
  run rdmaxx-setup.log meson setup "$tmp/rdmaxx-build" "$src" --prefix="$prefix" \
    --wrap-mode=nodownload -Dtests=false -Dexamples=false -Dbenchmarks=false
  run rdmaxx-install.log meson install -C "$tmp/rdmaxx-build" --destdir "$tmp/stage"
  local stray
  stray=$(cd "$tmp/stage" && find . -type f ! -path ".$prefix/*")
  if [[ -n $stray ]]; then
    echo "FAILED: installed outside the prefix $prefix:" >&2
    echo "$stray" >&2
    return 1
  fi
}

# The libdir meson chose (e.g. lib/x86_64-linux-gnu), from the staged pkg-config file.
staged_libdir() {
  local prefix=$1 pc
  pc=$(cd "$tmp/stage$prefix" && find . -path '*/pkgconfig/rdmaxx.pc' | head -n1)
  [[ -n $pc ]] || { echo "FAILED: no rdmaxx.pc installed" >&2; return 1; }
  pc=${pc#./}
  echo "${pc%/pkgconfig/rdmaxx.pc}"
}

project=$tmp/project
case $kind in
meson-subproject | pkg-config | cmake) ;;
*) echo "unknown consumer kind: $kind" >&2; exit 2 ;;
esac
cp -r "$here/$kind" "$project"
cp "$here/consumer.cpp" "$project/main.cpp"
cp "$here/consumer_cm.cpp" "$project/cm.cpp"
cp "$here/consumer_asio.cpp" "$project/asio.cpp"
say "consumer $kind of $src (build root $build_root), CXX=$CXX, in $tmp"

case $kind in
meson-subproject)
  say "copy rdmaxx into subprojects/rdmaxx"
  copy_rdmaxx "$project/subprojects/rdmaxx"
  say "meson setup (fallback forced); ninja"
  run setup.log meson setup "$tmp/build" "$project" --wrap-mode=nodownload \
    --force-fallback-for=rdmaxx
  if ! grep -q "Subproject rdmaxx finished" "$tmp/setup.log" ||
    ! grep -q "Dependency rdmaxx found: YES" "$tmp/setup.log"; then
    echo "FAILED: rdmaxx was not taken from the subproject" >&2
    cat "$tmp/setup.log" >&2
    exit 1
  fi
  run build.log ninja -C "$tmp/build" -j1
  exe=$tmp/build/consumer
  ;;
pkg-config)
  prefix=$tmp/prefix
  stage_install "$prefix"
  libdir=$(staged_libdir "$prefix")
  say "deploy the staged tree to $prefix (as a package would); make"
  mkdir -p "$prefix"
  cp -a "$tmp/stage$prefix/." "$prefix/"
  PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} \
    run build.log make -C "$project" CXX="$CXX"
  grep -q -- "-I$prefix/include" "$tmp/build.log" ||
    { echo "FAILED: the include dir did not come from pkg-config" >&2; cat "$tmp/build.log" >&2; exit 1; }
  exe=$project/consumer
  ;;
cmake)
  prefix=/opt/rdmaxx-consumer-test # baked into the install, never created: proves relocation
  stage_install "$prefix"
  staged=$tmp/stage$prefix
  say "cmake -DCMAKE_PREFIX_PATH=$staged; cmake --build"
  cmake_args=(-DCMAKE_PREFIX_PATH="$staged" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
              -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  run setup.log cmake -S "$project" -B "$tmp/build" "${cmake_args[@]}"
  grep -q "rdmaxx .* from $staged/" "$tmp/setup.log" ||
    { echo "FAILED: rdmaxx was not found in $staged" >&2; cat "$tmp/setup.log" >&2; exit 1; }
  run build.log cmake --build "$tmp/build" -j 1 --verbose
  grep -q -- "$staged/include" "$tmp/build.log" ||
    { echo "FAILED: the include dir was not computed from the staging tree" >&2; cat "$tmp/build.log" >&2; exit 1; }
  say "an incompatible version request (1.0) is refused"
  if cmake -S "$project" -B "$tmp/build-v1" "${cmake_args[@]}" -DRDMAXX_CONSUMER_WANT=1.0 \
      >"$tmp/setup-v1.log" 2>&1; then
    echo "FAILED: find_package(rdmaxx 1.0) accepted version 0.x" >&2
    cat "$tmp/setup-v1.log" >&2
    exit 1
  fi
  grep -q "rdmaxxConfig.cmake, version: " "$tmp/setup-v1.log" ||
    { echo "FAILED: the refusal is not a version mismatch" >&2; cat "$tmp/setup-v1.log" >&2; exit 1; }
  exe=$tmp/build/consumer
  ;;
esac

say "run $exe"
"$exe"
# rdma_cm is optional: the plain consumer must not link librdmacm, the cm one must.
exe_cm=$(dirname "$exe")/consumer-cm
needed() { readelf -d "$1" | grep -o 'Shared library: \[[^]]*\]'; }
if needed "$exe" | grep -q librdmacm; then
  echo "FAILED: $exe links librdmacm without including rdmaxx/connection.hpp" >&2
  exit 1
fi
needed "$exe_cm" | grep -q librdmacm ||
  { echo "FAILED: $exe_cm does not link librdmacm" >&2; exit 1; }
say "run $exe_cm"
"$exe_cm"
say "run $(dirname "$exe")/consumer-asio"
"$(dirname "$exe")/consumer-asio"
