#!/usr/bin/env bash
# Single-copy benchmark: produce then consume on one broker, optionally against a second
# build side by side (issue #24's "no regression of the single-copy figures").
#
#   xtask/bench/single.sh [ROUNDS]          (default 5)
#
# Environment:
#   FJORD_BIN        the build measured (default target/release/fjord)
#   FJORD_BIN_BEFORE a second build: every round runs it too, alternating ("before" / "after")
#   MESSAGES SIZE BATCH PARTITIONS   per run (default 5000000 200 50 6)
#
# Each round and build gets a fresh broker and data dir: a 6-partition topic, then
# `fjord bench produce --batch 50` and `fjord bench consume` of the same records, both
# with that build's own client (a client-side change is measured too). One JSON line a
# run (`fjord bench --json` with broker_cpu_us_per_msg from /proc, the figure that stays
# meaningful on a shared machine), tagged with build and mode; the end prints the medians.
# The data written is MESSAGES x SIZE a build at a time (1 GB at the defaults).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
rounds=${1:-5}
messages=${MESSAGES:-5000000}
size=${SIZE:-200}
batch=${BATCH:-50}
partitions=${PARTITIONS:-6}

bench_builds single.sh

bench_workdir single

# run BUILD: one fresh broker, produce then consume.
run() {
  local build=$1 bin=$after_bin mode line
  [ "$build" = before ] && bin=$before_bin
  start_broker "$bin" "$work"
  "$bin" topics create --bootstrap "127.0.0.1:$broker_port" --topic bench --partitions "$partitions" >/dev/null
  for mode in produce consume; do
    local extra=()
    [ "$mode" = produce ] && extra=(--batch "$batch")
    line=$("$bin" bench "$mode" --bootstrap "127.0.0.1:$broker_port" --topic bench --messages "$messages" --size "$size" \
      "${extra[@]}" --broker-pid "$broker_pid" --json)
    echo "{\"build\":\"$build\",\"mode\":\"$mode\",\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"report\":$line}" | tee -a "$results"
  done
  stop_broker
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
    groups.setdefault((r["mode"], r["build"]), []).append(r)
print()
print("| mode | build | runs | msg/s | MB/s | broker µs/msg | client µs/msg | load1 |")
print("|---|---|---|---|---|---|---|---|")
for (mode, build), rs in sorted(groups.items()):
    m = lambda k: statistics.median(r["report"][k] for r in rs)
    print(f"| {mode} | {build} | {len(rs)} | {m('msg_per_s'):,.0f} | {m('mb_per_s'):.0f} | "
          f"{m('broker_cpu_us_per_msg'):.3f} | {m('client_cpu_us_per_msg'):.3f} | "
          f"{statistics.median(r['load1'] for r in rs):.1f} |")
EOF
