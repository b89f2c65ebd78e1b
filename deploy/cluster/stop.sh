#!/usr/bin/env bash
# Stops what deploy/cluster/start.sh started from DATA_DIR (default ./fjord-cluster-data):
# the brokers one after another with SIGTERM (a controlled shutdown: each hands its
# leaderships to the others before it exits), then ZooKeeper. The data stays.
set -euo pipefail

data=${1:-./fjord-cluster-data}
[ -d "$data" ] || { echo "stop.sh: no data dir $data" >&2; exit 1; }

# Sends SIGTERM to the pid in file $1 and waits up to $2 seconds for it to exit, then
# SIGKILL.
stop_pid_file() {
  local file=$1 seconds=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 $((seconds * 10))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "pid $pid ($file) still running after ${seconds} s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stopped $(basename "$file" .pid) (pid $pid)"
  fi
  rm -f "$file"
}

for i in 3 2 1; do
  stop_pid_file "$data/broker-$i.pid" 60
done
stop_pid_file "$data/zookeeper.pid" 20
