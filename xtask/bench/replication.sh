#!/usr/bin/env bash
# Replicated-write benchmark (issue #24): throughput, open-loop latency and broker CPU per
# message of single-copy and replicated writes on deploy/cluster (ZooKeeper and three
# brokers on this machine), optionally against a second build side by side.
#
#   xtask/bench/replication.sh [ROUNDS]          (default 3)
#
# Environment:
#   FJORD_BIN        the broker build measured (default target/release/fjord)
#   FJORD_BIN_BEFORE a second broker build: a second cluster runs it on other ports and
#                    every run alternates between the two (labels "before" / "after")
#   BENCH_BIN        the `fjord bench` client of every run (default: each build's own
#                    binary, so a client-side change is measured on both sides too)
#   MESSAGES SIZE BATCH PARTITIONS   per run (default 2000000 200 50 6)
#   CASES            which of rf1-acks1 rf3-acksall rf3-acks1 (default all three)
#   OPEN_SECONDS     length of each open-loop run at a third of the case's median peak
#                    (default 10; 0 skips them)
#   AUDIT            0 turns the brokers' audit tier off (default: on, as deploy/cluster ships)
#   KEEP             1 keeps the data dirs (default: removed)
#   MIN_FREE_GB      free space wanted under TMPDIR before starting (default 5 a build)
#
# Each run prints one JSON line (`fjord bench --json`, with broker_cpu_us_per_msg from
# /proc: the figure that stays meaningful on a shared machine) tagged with build, case and
# kind; the end prints the medians. Ports are picked free at random; nothing else on the
# machine is touched. Say the load average (printed) with any figure you quote.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
rounds=${1:-3}
bench_override=${BENCH_BIN:-}
messages=${MESSAGES:-2000000}
size=${SIZE:-200}
batch=${BATCH:-50}
partitions=${PARTITIONS:-6}
cases=${CASES:-rf1-acks1 rf3-acksall rf3-acks1}
open_seconds=${OPEN_SECONDS:-10}

bench_builds replication.sh ${bench_override:+"$bench_override"}

# A run writes every message once per replica (RF 3 at the defaults: 1.2 GB, an open loop
# at a third of a 2M msg/s peak for 10 s: 2.7 GB); its topic is deleted after it. A disk
# that fills mid-run makes the brokers refuse appends (KAFKA_STORAGE_ERROR), which reads
# as a stall in the figures, so refuse to start without room (MIN_FREE_GB, default 5 a
# build: the audit topic and ZooKeeper keep theirs).
min_free_gb=${MIN_FREE_GB:-$((5 * ${#builds[@]}))}
free_gb=$(($(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 {print $4}') / 1024 / 1024))
if [ "$free_gb" -lt "$min_free_gb" ]; then
  echo "replication.sh: ${free_gb} GB free under ${TMPDIR:-/tmp}, want ${min_free_gb} (MIN_FREE_GB, or fewer MESSAGES/OPEN_SECONDS)" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fjord-bench.XXXXXX")
results=$work/results.jsonl

declare -A bootstrap pids bench
cleanup() {
  for build in "${builds[@]}"; do
    [ -d "$work/$build" ] && "$repo/deploy/cluster/stop.sh" "$work/$build" >/dev/null 2>&1 || true
  done
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

for build in "${builds[@]}"; do
  bin=$after_bin
  [ "$build" = before ] && bin=$before_bin
  p1=$(free_port) p2=$(free_port) p3=$(free_port) zk=$(free_port)
  RUST_LOG=warn FJORD_AUDIT_ENABLE=$([ "${AUDIT:-1}" = 0 ] && echo false || echo true) FJORD_BIN=$bin ZK_PORT=$zk FJORD_PORTS="$p1 $p2 $p3" \
    "$repo/deploy/cluster/start.sh" "$work/$build" >"$work/$build.start.log"
  bootstrap[$build]="127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3"
  bench[$build]=${bench_override:-$bin}
  pids[$build]="$(cat "$work/$build/broker-1.pid"),$(cat "$work/$build/broker-2.pid"),$(cat "$work/$build/broker-3.pid")"
done

# Each run writes to a topic of its own, created for it and deleted after it. A run adds
# every message to the page cache once per replica, and once the cache had filled the
# brokers reclaimed pages on every append: the same RF 1 run cost 0.38 then 0.91 µs/msg
# of broker CPU on one cluster, the later runs charged for the earlier runs' data (RF 3
# three times as much). Deleting the topic frees its pages, so every run starts alike.
replication_factor() { case $1 in rf1-*) echo 1 ;; rf3-*) echo 3 ;; *) echo "unknown case $1" >&2; exit 1 ;; esac; }
acks() { case $1 in *-acks1) echo 1 ;; *-acksall) echo all ;; *) echo "unknown case $1" >&2; exit 1 ;; esac; }
topic_seq=0

# run BUILD CASE KIND [extra bench args...]
run() {
  local build=$1 case=$2 kind=$3
  shift 3
  local rf topic line
  rf=$(replication_factor "$case")
  topic_seq=$((topic_seq + 1))
  topic="$case-$topic_seq"
  # deploy/cluster's brokers default to min.insync.replicas=2, which a single copy can never meet.
  "${bench[$build]}" topics --bootstrap "${bootstrap[$build]}" create --topic "$topic" --partitions "$partitions" \
    --replication-factor "$rf" --config min.insync.replicas=$((rf == 1 ? 1 : 2)) >/dev/null
  # Warm up: leaders elected and known, followers fetching, connections open.
  "${bench[$build]}" bench produce --bootstrap "${bootstrap[$build]}" --topic "$topic" --messages 20000 --acks all --json >/dev/null
  line=$("${bench[$build]}" bench produce --bootstrap "${bootstrap[$build]}" --topic "$topic" --acks "$(acks "$case")" \
    --size "$size" --batch "$batch" --broker-pid "${pids[$build]}" --json "$@")
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  "${bench[$build]}" topics --bootstrap "${bootstrap[$build]}" delete "$topic" >/dev/null
  echo "{\"build\":\"$build\",\"case\":\"$case\",\"kind\":\"$kind\",\"load1\":$load,\"report\":$line}" | tee -a "$results"
}

for _ in $(seq 1 "$rounds"); do
  for case in $cases; do
    for build in "${builds[@]}"; do
      run "$build" "$case" peak --messages "$messages"
    done
  done
done

median_peak() {
  python3 - "$results" "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(int(statistics.median(r["report"]["msg_per_s"] for r in rows if r["build"] == sys.argv[2] and r["case"] == sys.argv[3] and r["kind"] == "peak")))
EOF
}

if [ "$open_seconds" -gt 0 ]; then
  for _ in $(seq 1 "$rounds"); do
    for case in $cases; do
      for build in "${builds[@]}"; do
        rate=$(($(median_peak "$build" "$case") / 3))
        run "$build" "$case" open --rate "$rate" --messages $((rate * open_seconds))
      done
    done
  done
fi

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["kind"], r["case"], r["build"]), []).append(r)
print()
print("| kind | case | build | runs | msg/s | p50 ms | p99 ms | p99.9 ms | max ms | broker µs/msg | load1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (kind, case, build), rs in sorted(groups.items()):
    m = lambda k: statistics.median(r["report"][k] for r in rs)
    load = statistics.median(r["load1"] for r in rs)
    print(f"| {kind} | {case} | {build} | {len(rs)} | {m('msg_per_s'):,.0f} | {m('p50_ms'):.2f} | {m('p99_ms'):.2f} | "
          f"{m('p999_ms'):.2f} | {m('max_ms'):.2f} | {m('broker_cpu_us_per_msg'):.2f} | {load:.1f} |")
EOF
