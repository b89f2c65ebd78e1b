#!/usr/bin/env bash
# Two online clusters (dc1, dc2) and one analytics cluster on this machine, with the mirror
# copying both online clusters into the analytics one. One broker per cluster, each with
# its own port and data dir; with ZooKeeper installed, the three clusters share one
# ZooKeeper under the chroots /fjord-dc1, /fjord-dc2 and /fjord-analytics, otherwise each
# broker uses the embedded metadata store.
#
#   deploy/multi-dc/start.sh          # starts everything in the background, prints how to use it
#   deploy/multi-dc/stop.sh           # stops it (SIGTERM, in reverse order)
#
# Environment: FJORD (the fjord binary; default: `fjord` on PATH, else target/release or
# target/debug), MULTI_DC_DIR (data and logs, default ./multi-dc-data), ZOOKEEPER_JAR
# (default /usr/share/java/zookeeper.jar; set it to "none" for standalone brokers).
set -euo pipefail
export NO_COLOR=1  # plain logs in the log files

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${MULTI_DC_DIR:-$PWD/multi-dc-data}"
fjord="${FJORD:-$(command -v fjord || true)}"
for candidate in "$root/target/release/fjord" "$root/target/debug/fjord"; do
    [ -n "$fjord" ] && break
    [ -x "$candidate" ] && fjord="$candidate"
done
[ -n "$fjord" ] || { echo "no fjord binary: cargo build --release -p fjord, or set FJORD" >&2; exit 1; }
zk_jar="${ZOOKEEPER_JAR:-/usr/share/java/zookeeper.jar}"

zk_port=12181
dc1=127.0.0.1:19092
dc2=127.0.0.1:29092
analytics=127.0.0.1:39092
mirror_metrics=127.0.0.1:9400

mkdir -p "$dir"
pids="$dir/pids"
if [ -s "$pids" ]; then
    echo "already running (see $pids); stop it with $here/stop.sh" >&2
    exit 1
fi

start() { # name, command...
    local name="$1"; shift
    "$@" >"$dir/$name.log" 2>&1 &
    echo "$! $name" >>"$pids"
}

wait_for() { # what, command...
    local what="$1"; shift
    for _ in $(seq 1 100); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "$what did not come up; see the logs in $dir" >&2
    MULTI_DC_DIR="$dir" "$here/stop.sh"
    exit 1
}

zk_connect=""
if [ "$zk_jar" != none ] && [ -f "$zk_jar" ] && command -v java >/dev/null; then
    mkdir -p "$dir/zookeeper/data"
    cat >"$dir/zookeeper/zoo.cfg" <<CFG
tickTime=2000
dataDir=$dir/zookeeper/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
CFG
    start zookeeper java -cp "/etc/zookeeper/conf:$zk_jar:/usr/share/java/slf4j-simple.jar" \
        org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zookeeper/zoo.cfg"
    wait_for "ZooKeeper on 127.0.0.1:$zk_port" bash -c "echo srvr | nc -q1 127.0.0.1 $zk_port | grep -q Mode:"
    zk_connect="127.0.0.1:$zk_port"
fi

broker() { # name, id, address, audit tier
    local zk=()
    [ -n "$zk_connect" ] && zk=(--zookeeper "$zk_connect/fjord-$1")
    # The audit's broker tier: each broker counts what it appends as leader. The report
    # adds a tier up over clusters, so the analytics brokers (which append the mirrored
    # copies) count under a tier of their own.
    start "$1" env FJORD_AUDIT_ENABLE=true FJORD_AUDIT_CLUSTER="$1" FJORD_AUDIT_TIER="$4" \
        "$fjord" broker --id "$2" --listen "$3" --data-dir "$dir/$1" "${zk[@]}"
}
broker dc1 1 "$dc1" broker
broker dc2 1 "$dc2" broker
broker analytics 1 "$analytics" analytics-broker
for b in "$dc1" "$dc2" "$analytics"; do
    wait_for "the broker on $b" "$fjord" topics --bootstrap "$b" list
done

# The example topic, 4 partitions in each online cluster; the mirror creates it in the
# analytics cluster with the same partition count and configs.
for b in "$dc1" "$dc2"; do
    "$fjord" topics --bootstrap "$b" create --topic page-views --partitions 4 --config retention.ms=604800000 >/dev/null
done

start mirror "$fjord" mirror --source "dc1=$dc1" --source "dc2=$dc2" --target "$analytics" \
    --topics 'page-views|clicks.*' --group analytics-mirror --instance-id "$(hostname)-mirror" \
    --metrics "$mirror_metrics" --audit-cluster analytics
wait_for "the mirror's status endpoint" "$fjord" mirror status --metrics "$mirror_metrics"

cat <<INFO
running (data and logs in $dir${zk_connect:+, ZooKeeper on $zk_connect with chroots /fjord-dc1, /fjord-dc2, /fjord-analytics}):
  online dc1        $dc1
  online dc2        $dc2
  analytics         $analytics
  mirror metrics    http://$mirror_metrics/metrics  (status: $fjord mirror status --metrics $mirror_metrics)
try:
  printf 'user1|home\nuser2|cart\n' | $fjord produce --bootstrap $dc1 --topic page-views --key-separator '|'
  printf 'user3|search\n' | $fjord produce --bootstrap $dc2 --topic page-views --key-separator '|'
  $fjord consume --bootstrap $analytics --topic page-views --from beginning --max-messages 3
stop: $here/stop.sh
INFO
