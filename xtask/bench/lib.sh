# Helpers shared by the bench scripts (sourced, not run).

# `true` when something accepts connections on 127.0.0.1:$1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Prints a random port in 20000-59999 that nothing listens on now.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    listening "$port" || { echo "$port"; return; }
  done
}

# bench_builds SCRIPT [BIN...]: the builds a script measures, FJORD_BIN (default the
# repository's target/release/fjord) and, when set, FJORD_BIN_BEFORE beside it: sets
# after_bin, before_bin and builds ("after", or "before" and "after"), and exits unless
# each of them and every other BIN given is an executable.
bench_builds() {
  local script=$1 bin
  shift
  after_bin=${FJORD_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/target/release/fjord}
  before_bin=${FJORD_BIN_BEFORE:-}
  builds=(after)
  [ -n "$before_bin" ] && builds=(before after)
  for bin in "$after_bin" ${before_bin:+"$before_bin"} "$@"; do
    [ -x "$bin" ] || { echo "$script: no executable $bin (cargo build --release -p fjord)" >&2; exit 1; }
  done
}

# bench_workdir NAME: a scratch dir for a one-broker script ($work, its JSON lines in
# $results), removed on exit with the broker start_broker started, if any, stopped.
bench_workdir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/fjord-$1.XXXXXX")
  results=$work/results.jsonl
  trap 'stop_broker; rm -rf "$work"' EXIT
}

# start_broker BIN DIR: a fresh single broker of build BIN on a free port, its data dir
# under DIR, ready for connections; sets broker_pid, broker_port and broker_data.
start_broker() {
  broker_port=$(free_port)
  broker_data=$(mktemp -d "$2/data.XXXXXX")
  RUST_LOG=warn "$1" broker --id 0 --listen "127.0.0.1:$broker_port" --data-dir "$broker_data" >"$broker_data.log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 100); do listening "$broker_port" && break; sleep 0.1; done
}

# stop_broker: stops the broker start_broker started, if any, and removes its data.
stop_broker() {
  [ -n "${broker_pid:-}" ] || return 0
  kill "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
  rm -rf "$broker_data" "$broker_data.log"
  broker_pid=""
}
