#!/usr/bin/env bash
# Transactional against idempotent produce with fjord's own client, one broker (issue
# #20's produce figure: transactions of PER_TRANSACTION records, at least 70% of the
# idempotent rate), optionally against a second build side by side.
# `xtask/bench/transactions.py` measures the same with confluent-kafka.
#
#   xtask/bench/transactions.sh [ROUNDS]          (default 5)
#
# Environment:
#   FJORD_BIN        the build measured (default target/release/fjord)
#   FJORD_BIN_BEFORE a second build: every round runs it too, alternating ("before" / "after")
#   MESSAGES SIZE BATCH PARTITIONS PRODUCERS PER_TRANSACTION
#                    per run (default 2000000 200 50 6 8 100)
#
# Every run gets a fresh broker and data dir and a PARTITIONS-partition topic, then
# `fjord bench produce --acks all --producers PRODUCERS` of that build's own client,
# idempotent or with `--transaction-records PER_TRANSACTION` (the two alternate which goes
# first from round to round). One JSON line a run, tagged with build, mode and round; the
# end prints the medians and the median of the per-round ratios, the figure that stays
# meaningful while the machine's speed drifts from minute to minute.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
rounds=${1:-5}
messages=${MESSAGES:-2000000}
size=${SIZE:-200}
batch=${BATCH:-50}
partitions=${PARTITIONS:-6}
producers=${PRODUCERS:-8}
per_transaction=${PER_TRANSACTION:-100}

bench_builds transactions.sh

bench_workdir transactions

# run ROUND BUILD MODE: one fresh broker, one produce run.
run() {
  local round=$1 build=$2 mode=$3 bin=$after_bin line
  [ "$build" = before ] && bin=$before_bin
  local extra=()
  [ "$mode" = transactional ] && extra=(--transaction-records "$per_transaction")
  start_broker "$bin" "$work"
  "$bin" topics create --bootstrap "127.0.0.1:$broker_port" --topic bench --partitions "$partitions" >/dev/null
  line=$("$bin" bench produce --bootstrap "127.0.0.1:$broker_port" --topic bench --messages "$messages" --size "$size" \
    --batch "$batch" --acks all --producers "$producers" "${extra[@]}" --broker-pid "$broker_pid" --json)
  echo "{\"round\":$round,\"build\":\"$build\",\"mode\":\"$mode\",\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"report\":$line}" |
    tee -a "$results"
  stop_broker
}

for round in $(seq 1 "$rounds"); do
  modes=(idempotent transactional)
  [ $((round % 2)) -eq 0 ] && modes=(transactional idempotent)
  for build in "${builds[@]}"; do
    for mode in "${modes[@]}"; do
      run "$round" "$build" "$mode"
    done
  done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["build"], {}).setdefault(r["mode"], {})[r["round"]] = r["report"]
print()
print("| build | runs | idempotent msg/s | transactional msg/s | ratio (median of rounds) | ratios | "
      "broker µs/msg idem / txn | client µs/msg idem / txn |")
print("|---|---|---|---|---|---|---|---|")
for build, modes in sorted(by.items()):
    idem, txn = modes.get("idempotent", {}), modes.get("transactional", {})
    rounds = sorted(set(idem) & set(txn))
    ratios = [100 * txn[r]["msg_per_s"] / idem[r]["msg_per_s"] for r in rounds]
    m = lambda runs, k: statistics.median(x[k] for x in runs.values())
    print(f"| {build} | {len(rounds)} | {m(idem, 'msg_per_s'):,.0f} | {m(txn, 'msg_per_s'):,.0f} | "
          f"{statistics.median(ratios):.1f}% | {', '.join(f'{x:.0f}' for x in ratios)} | "
          f"{m(idem, 'broker_cpu_us_per_msg'):.2f} / {m(txn, 'broker_cpu_us_per_msg'):.2f} | "
          f"{m(idem, 'client_cpu_us_per_msg'):.2f} / {m(txn, 'client_cpu_us_per_msg'):.2f} |")
EOF
