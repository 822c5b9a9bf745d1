# Sourced by scripts/test: runs stages so that one failing stage does not hide the others.
# `stage NAME CMD…` runs CMD and records its result and time; `stages_summary` prints one line
# per stage and returns non-zero if any failed. scripts/stages-test checks this file.

stages_names=()
stages_results=()
stages_failed=0

stage() {
  local name="$1"
  shift
  local start=$SECONDS status=0
  echo "== $name" >&2
  "$@" || status=$?
  stages_names+=("$name")
  if [ "$status" = 0 ]; then
    stages_results+=("ok      $((SECONDS - start))s")
  else
    stages_results+=("FAILED  $((SECONDS - start))s (exit $status)")
    stages_failed=1
  fi
}

stages_summary() {
  echo
  echo "summary (total ${SECONDS}s)"
  local i
  for i in "${!stages_names[@]}"; do
    printf '  %-34s %s\n' "${stages_names[$i]}" "${stages_results[$i]}"
  done
  return "$stages_failed"
}
