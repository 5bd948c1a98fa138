#!/usr/bin/env bash
# The device check: every GPU figure of packpipe in one run on a lent GPU machine, under 8 minutes
# (DEVICE.md says what to carry and the one command). From the repository root, with .device/
# carried (scripts/gpu-prefix.sh download):
#
#   scripts/device-check.sh                      # on the GPU machine: report in $OUT
#   scripts/device-check.sh --dry-run [--out D]  # here: the same steps on the CPU, CUDA steps skipped
#   scripts/device-check.sh --steps torch,profile   # a rerun on the still-warm machine (build kept)
#
# Picks the interpreter that has torch and numpy ($DEVICE_CHECK_PYTHON, else python3, else
# /usr/bin/python3) and runs scripts/device_check.py with it; --help lists the options.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=""
for cand in "${DEVICE_CHECK_PYTHON:-}" python3 /usr/bin/python3; do
  [[ -n $cand ]] || continue
  if "$cand" -c 'import torch, numpy' > /dev/null 2>&1; then
    py=$(command -v "$cand")
    break
  fi
done
if [[ -z $py ]]; then
  echo "device-check: no Python with torch and numpy (tried \$DEVICE_CHECK_PYTHON, python3, /usr/bin/python3); the" \
       "report records what it can" >&2
  py=$(command -v python3 || echo /usr/bin/python3)
fi
exec "$py" "$root/scripts/device_check.py" --python "$py" "$@"
