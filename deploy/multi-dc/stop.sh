#!/usr/bin/env bash
# Stops what start.sh started, newest first (the mirror commits and leaves its groups on
# SIGTERM before the brokers go).
set -uo pipefail
dir="${MULTI_DC_DIR:-$PWD/multi-dc-data}"
pids="$dir/pids"
[ -s "$pids" ] || { echo "nothing running (no $pids)"; exit 0; }
tac "$pids" | while read -r pid name; do
    if kill -TERM "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "$name ($pid) ignored SIGTERM for 10 s; killing it"
            kill -KILL "$pid" 2>/dev/null
        fi
        echo "stopped $name"
    fi
done
rm -f "$pids"
