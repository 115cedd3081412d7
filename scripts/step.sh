# Sourced by the setup scripts: `step NAME "what it does" command args...` prints one line per
# step and sends the command's own output to $EXPERTD_LOG_DIR/NAME.log (default build/logs); on
# failure it prints the log's last lines and its path, and the script stops.
EXPERTD_LOG_DIR=${EXPERTD_LOG_DIR:-$(pwd)/build/logs}
step() {
  local name=$1 what=$2
  shift 2
  mkdir -p "$EXPERTD_LOG_DIR"
  local log="$EXPERTD_LOG_DIR/$name.log" t0=$SECONDS
  printf '== %s ... ' "$what"
  if "$@" >"$log" 2>&1; then
    echo "done ($((SECONDS - t0)) s)"
  else
    local rc=$?
    echo "FAILED (exit $rc); the last lines of $log:"
    tail -n 40 "$log" | sed 's/^/   | /'
    echo "   full log: $log"
    exit "$rc"
  fi
}
