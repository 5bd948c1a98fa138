#!/usr/bin/env bash
# find_package(packpipe) from an install: installs BUILD_DIR into a temporary prefix, then
# configures, builds and runs examples/cmake_consumer against it with CMAKE_PREFIX_PATH.
#
#   test_find_package.sh BUILD_DIR SOURCE_DIR CMAKE CXX_COMPILER [SANITIZE]
#
# The consumer is built with the compiler that built packpipe (static C++ libraries). Sanitizer
# flags are not part of the package, so with SANITIZE (the tree's PACKPIPE_SANITIZE) the consumer
# compiles and links with the same -fsanitize flags itself, as any consumer of that build must.
set -euo pipefail

if [[ $# -lt 4 || $# -gt 5 ]]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR CMAKE CXX_COMPILER [SANITIZE]" >&2
  exit 2
fi
build=$1
src=$2
cmake=$3
cxx=$4
sanitize=${5:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/packpipe-find-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() {
  echo "FAIL: $*"
  exit 1
}

if ! "$cmake" --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  fail "cmake --install $build --prefix $prefix"
fi

# What the package holds.
config=$(find "$prefix" -name packpipeConfig.cmake -path '*/cmake/packpipe/*')
[[ -n $config ]] || fail "no packpipeConfig.cmake under $prefix"
cmake_dir=$(dirname "$config")
for f in packpipeConfigVersion.cmake packpipeTargets.cmake FindNCCL.cmake; do
  [[ -f $cmake_dir/$f ]] || fail "$cmake_dir/$f was not installed"
done
for h in common/config.h common/errors.h partition/partition.h planner/planner.h; do
  [[ -f $prefix/include/packpipe/$h ]] || fail "header $prefix/include/packpipe/$h was not installed"
done
if detail=$(find "$prefix/include" -path '*/detail/*' -print -quit) && [[ -n $detail ]]; then
  fail "a private detail/ header was installed: $detail"
fi
if grep -nE -- '-W(all|extra|pedantic)|packpipe_warnings' "$cmake_dir"/packpipeTargets*.cmake; then
  fail "the exported targets carry packpipe's warning flags (above)"
fi

# The consumer, against the install only.
cxx_flags=()
if [[ -n $sanitize ]]; then
  cxx_flags=("-DCMAKE_CXX_FLAGS=-fsanitize=$sanitize -fno-omit-frame-pointer -fno-sanitize-recover=all"
             "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=$sanitize")
fi
if ! "$cmake" -S "$src/examples/cmake_consumer" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CXX_COMPILER="$cxx" "${cxx_flags[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
     -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
     > "$tmp/configure.log" 2>&1; then
  cat "$tmp/configure.log"
  fail "configuring examples/cmake_consumer against $prefix"
fi
found_dir=$(sed -n 's/^packpipe_DIR:PATH=//p' "$tmp/build/CMakeCache.txt")
[[ $found_dir == "$cmake_dir" ]] || fail "find_package(packpipe) used '$found_dir', expected the install's '$cmake_dir'"
if ! "$cmake" --build "$tmp/build" > "$tmp/build.log" 2>&1; then
  cat "$tmp/build.log"
  fail "building examples/cmake_consumer"
fi
commands=$tmp/build/compile_commands.json
grep -q -- "$prefix/include/packpipe" "$commands" || fail "the consumer does not compile with $prefix/include/packpipe: $(cat "$commands")"
if grep -nE -- '-W(all|extra|pedantic)' "$commands"; then
  fail "the consumer inherited packpipe's warning flags (above)"
fi

out=$("$tmp/build/packpipe_consumer") || fail "packpipe_consumer exited with $?: $out"
echo "$out"
expected='^packpipe [0-9]+\.[0-9]+\.[0-9]+: 32 samples in [1-9][0-9]* micro-batches, plan valid \([1-9][0-9]* instructions\)$'
[[ $out =~ $expected ]] || fail "packpipe_consumer printed '$out', expected a line matching '$expected'"
echo "ok: find_package(packpipe) from $prefix, consumer built and ran"
