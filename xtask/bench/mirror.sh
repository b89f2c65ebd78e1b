#!/usr/bin/env bash
# Mirror benchmark: how fast `fjord mirror` copies a topic from one broker into another,
# optionally against a second build side by side.
#
#   xtask/bench/mirror.sh [ROUNDS]          (default 3)
#
# Environment:
#   FJORD_BIN        the build measured (default target/release/fjord)
#   FJORD_BIN_BEFORE a second build: every round runs it too, alternating ("before" / "after")
#   MESSAGES SIZE PARTITIONS   per run (default 1000000 200 6)
#
# Each round and build gets two fresh brokers (source and target) of that build: the
# source's 6-partition topic is filled with `fjord bench produce`, then `fjord mirror`
# starts and the clock runs until its group's committed offsets reach the source's log
# ends (every record acknowledged by the target with acks=all, then committed). One JSON
# line a run: msg/s and the mirror's CPU per message (utime + stime from /proc, the
# figure that stays meaningful on a shared machine); the end prints the medians.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
rounds=${1:-3}
messages=${MESSAGES:-1000000}
size=${SIZE:-200}
partitions=${PARTITIONS:-6}

bench_builds mirror.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/fjord-mirror.XXXXXX")
results=$work/results.jsonl
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# broker BIN: starts a broker of build BIN on a free port in its own data dir; sets port.
broker() {
  local data
  port=$(free_port)
  data=$(mktemp -d "$work/data.XXXXXX")
  RUST_LOG=warn "$1" broker --id 0 --listen "127.0.0.1:$port" --data-dir "$data" >"$data.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do listening "$port" && break; sleep 0.1; done
}

# cpu_us PID: user + system CPU time of a process so far, in µs.
cpu_us() {
  local ticks
  ticks=$(awk '{print $14 + $15}' "/proc/$1/stat")
  echo $((ticks * 1000000 / $(getconf CLK_TCK)))
}

# committed PORT BIN: the sum of the mirror group's committed offsets on the source.
committed() {
  "$2" groups describe fjord-mirror --bootstrap "127.0.0.1:$1" 2>/dev/null |
    awk -F'\t' 'NR > 1 && $3 ~ /^[0-9]+$/ { sum += $3 } END { print sum + 0 }'
}

run() {
  local build=$1 bin=$after_bin source target mirror start end cpu
  [ "$build" = before ] && bin=$before_bin
  broker "$bin"
  source=$port
  broker "$bin"
  target=$port
  "$bin" topics create --bootstrap "127.0.0.1:$source" --topic bench --partitions "$partitions" >/dev/null
  "$bin" bench produce --bootstrap "127.0.0.1:$source" --topic bench --messages "$messages" --size "$size" --batch 50 >/dev/null
  start=$(date +%s.%N)
  RUST_LOG=warn "$bin" mirror --source "dc1=127.0.0.1:$source" --target "127.0.0.1:$target" --topics bench \
    >"$work/mirror.log" 2>&1 &
  mirror=$!
  pids+=("$mirror")
  until [ "$(committed "$source" "$bin")" -ge "$messages" ]; do
    kill -0 "$mirror" 2>/dev/null || { echo "mirror.sh: the mirror exited" >&2; cat "$work/mirror.log" >&2; exit 1; }
    sleep 0.1
  done
  end=$(date +%s.%N)
  cpu=$(cpu_us "$mirror")
  kill "$mirror"
  wait "$mirror" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  rm -rf "$work"/data.*
  python3 - "$build" "$messages" "$start" "$end" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF' | tee -a "$results"
import json, sys
build, n, start, end, cpu, load = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
print(json.dumps({"build": build, "messages": n, "seconds": round(end - start, 3), "msg_per_s": round(n / (end - start)),
                  "mirror_cpu_us_per_msg": round(cpu / n, 3), "load1": load}))
EOF
}

for _ in $(seq 1 "$rounds"); do
  for build in "${builds[@]}"; do
    run "$build"
  done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault(r["build"], []).append(r)
print()
print("| build | runs | msg/s (to committed) | mirror µs/msg | load1 |")
print("|---|---|---|---|---|")
for build, rs in sorted(groups.items(), reverse=True):
    m = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {build} | {len(rs)} | {m('msg_per_s'):,.0f} | {m('mirror_cpu_us_per_msg'):.3f} | {m('load1'):.1f} |")
EOF
