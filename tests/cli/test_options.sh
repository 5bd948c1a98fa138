#!/usr/bin/env bash
# Every numeric option of every subcommand: a negative value for an unsigned option and NaN/inf
# for any number are refused with a message naming the option (no wrap-around, no crash); every
# floating option is range-checked as a double when parsed (1e300 and -0.5 refused: no cast of a huge
# value into an integer, no rounding of a negative one into range).
set -uo pipefail
CLI=$1
fail=0
# Subcommand paths: top-level ones and their nested subcommands, read from --help.
subs() {
  "$CLI" --help | awk '/^Subcommands:/{s=1;next} s&&NF{print $1}'
}
paths=()
for s in $(subs); do
  paths+=("$s")
  for t in $("$CLI" "$s" --help | awk '/^Subcommands:/{s=1;next} s&&NF{print $1}'); do paths+=("$s $t"); done
done
((${#paths[@]} >= 10)) || { echo "FAIL: found only ${#paths[@]} subcommands"; exit 1; }
checked=0
for p in "${paths[@]}"; do
  # shellcheck disable=SC2086
  help=$("$CLI" $p --help)
  while read -r opt type; do
    for bad in -1 nan inf 1e300 -0.5 -1e300; do
      [[ $type != UINT* && $bad == -1 ]] && continue
      [[ $type != FLOAT* && $bad != -1 && $bad != nan && $bad != inf ]] && continue
      # shellcheck disable=SC2086
      out=$("$CLI" $p "$opt" "$bad" 2>&1)
      rc=$?
      if ((rc == 0 || rc >= 128)) || ! grep -q -- "${opt}" <<<"$out"; then
        echo "FAIL: packpipe $p $opt $bad: rc $rc: $out"
        fail=1
      fi
      checked=$((checked + 1))
    done
  done < <(grep -oE -- '--[a-z0-9-]+ (UINT|INT|FLOAT)' <<<"$help")
done
((checked >= 40)) || { echo "FAIL: only $checked option checks ran"; exit 1; }

# A mistyped subcommand or option is named, with what the command takes and the closest name (CLI11 said
# "A subcommand is required", or listed the unexpected words in reverse).
typo() {  # typo PATTERN ARGS...
  local pat=$1; shift
  local out rc=0
  out=$("$CLI" "$@" 2>&1 >/dev/null) || rc=$?
  if (( rc == 0 )) || ! grep -q -- "$pat" <<<"$out"; then echo "FAIL: $*: rc $rc: $out"; fail=1; fi
}
typo "unknown subcommand 'plann' of \`packpipe\`: expected one of .*plan.*; did you mean plan?" plann
typo "unknown subcommand 'infos' of \`packpipe dataset\`: .*did you mean info?" dataset infos X
typo "\`packpipe dataset\` needs a subcommand: expected one of info, verify" dataset
typo "unknown option '--stage' for \`packpipe plan\`; did you mean --stages?" plan --stage 4
typo "unknown subcommand 'insepct' of \`packpipe plan\`: .*did you mean inspect?" plan insepct x.plan --iteration 3
echo "checked $checked option values over ${#paths[@]} subcommands"
exit $fail
