#!/usr/bin/env bash
# The layer order, checked on the sources: every #include of a component's header names the
# including component itself or one in its dependency closure (BUILD/layers.txt, written by
# cmake/PackpipeComponent.cmake), and detail/ headers stay inside their component. The build
# already refuses an upward include in a compiled file; this scan also covers headers that no
# translation unit includes.
#
#   test_layering.sh BUILD_DIR SOURCE_DIR
#
# Rules, for every .h/.cpp/.cu/.cuh file under SOURCE_DIR (build trees and hidden folders skipped):
#  - in a component's folder: an include whose first path segment is a component or another
#    top-level folder (cli/, tests/, ...) names the component or its closure; no "../" includes;
#  - anywhere outside component X: no include of "X/detail/...", except under tests/ and
#    benchmarks/, which test and measure the internals on purpose.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
  exit 2
fi
build=$1
src=$(cd "$2" && pwd)
layers=$build/layers.txt
if [[ ! -s $layers ]]; then
  echo "FAIL: $layers is missing or empty (configure the build first)"
  exit 1
fi

declare -A allowed=()  # component -> " self dep dep ... "
components=()
while IFS= read -r line || [[ -n $line ]]; do
  [[ -z ${line//[[:space:]]/} ]] && continue
  name=${line%%:*}
  deps=${line#*:}
  components+=("$name")
  allowed[$name]=" $name $(echo $deps) "
  if [[ ! -d $src/$name ]]; then
    echo "FAIL: layers.txt names component '$name', but $src/$name is not a folder"
    exit 1
  fi
done < "$layers"
if [[ ${#components[@]} -eq 0 ]]; then
  echo "FAIL: $layers lists no component"
  exit 1
fi

# Top-level folders to scan, and the names an include may not reach from a component unless allowed.
declare -A top=()
scan=()
for d in "$src"/*/; do
  d=${d%/}
  n=${d##*/}
  [[ $n == build* || -e $d/CMakeCache.txt ]] && continue
  top[$n]=1
  scan+=("$d")
done

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">]'
violations=0
files=0
report() {
  echo "$1"
  violations=$((violations + 1))
}

while IFS= read -r -d '' file; do
  files=$((files + 1))
  rel=${file#"$src"/}
  owner=${rel%%/*}
  [[ -n ${allowed[$owner]:-} ]] || owner=""
  while IFS= read -r hit; do
    lineno=${hit%%:*}
    text=${hit#*:}
    [[ $text =~ $include_re ]] || continue
    path=${BASH_REMATCH[1]}
    target=""
    [[ $path == */* ]] && target=${path%%/*}
    is_component=""
    [[ -n $target && -n ${allowed[$target]:-} ]] && is_component=1
    if [[ -n $owner ]]; then
      if [[ $path == ../* || $path == */../* ]]; then
        report "$rel:$lineno: #include \"$path\": component '$owner' includes by paths from the repository root, not '../'"
      elif [[ -n $target && ( -n $is_component || -n ${top[$target]:-} ) && ${allowed[$owner]} != *" $target "* ]]; then
        expected=$(echo ${allowed[$owner]})
        report "$rel:$lineno: #include \"$path\": expected a header of ${expected// /, } (component '$owner' and its dependency closure in layers.txt), found a header of '$target'"
        continue
      fi
    elif [[ $rel == tests/* || $rel == benchmarks/* ]]; then
      continue
    fi
    if [[ -n $is_component && $target != "$owner" && $path == "$target"/detail/* ]]; then
      report "$rel:$lineno: #include \"$path\": detail/ headers are private to component '$target'; expected only '$target/' files to include it"
    fi
  done < <(grep -nE "$include_re" "$file" || true)
done < <(find "${scan[@]}" \( -name '.*' -prune \) -o -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0)

in_components=0
for c in "${components[@]}"; do
  n=$(find "$src/$c" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | wc -l)
  in_components=$((in_components + n))
done
if [[ $in_components -eq 0 ]]; then
  echo "FAIL: no source file found in the components (${components[*]})"
  exit 1
fi
if [[ $violations -ne 0 ]]; then
  echo "FAIL: $violations layering violation(s) in $files files"
  exit 1
fi
echo "ok: $files files, $in_components in ${#components[@]} components (${components[*]}), no layering violation"
