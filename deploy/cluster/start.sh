#!/usr/bin/env bash
# Starts ZooKeeper and a 3-broker Fjord cluster on this machine, in the background.
#
#   deploy/cluster/start.sh [DATA_DIR]      (default ./fjord-cluster-data)
#   deploy/cluster/stop.sh  [DATA_DIR]
#
# Needs `fjord` on PATH (or FJORD_BIN=/path/to/fjord) and Debian's `zookeeper` package
# (apt-get install -y zookeeper). Brokers listen on 127.0.0.1:9092-9094 and ZooKeeper on
# 127.0.0.1:2181, as in the configs next to this script; to run beside something that holds
# those ports, set ZK_PORT and FJORD_PORTS (e.g. ZK_PORT=12181 FJORD_PORTS="19092 19093 19094").
# Logs and pid files go to DATA_DIR; the data survives stop/start.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data=${1:-./fjord-cluster-data}
fjord=${FJORD_BIN:-fjord}
zk_classpath=/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar

started=false
# Fails, stopping whatever this run already started.
die() {
  echo "start.sh: $*" >&2
  if $started; then "$here/stop.sh" "$data" >&2; fi
  exit 1
}

command -v "$fjord" >/dev/null || die "no fjord binary: put it on PATH or set FJORD_BIN (cargo build --release -p fjord gives target/release/fjord)"
[ -f /usr/share/java/zookeeper.jar ] || die "ZooKeeper is not installed: apt-get install -y zookeeper"
command -v java >/dev/null || die "java is missing (Debian's zookeeper package pulls in a JRE)"

mkdir -p "$data"
data=$(cd "$data" && pwd)

# Ports: from the config files unless overridden.
config_port() { sed -n 's/^"\{0,1\}listeners"\{0,1\} *= *"\(PLAINTEXT:\/\/\)\{0,1\}[^:]*:\([0-9]*\)".*/\2/p' "$1"; }
zk_port=${ZK_PORT:-$(sed -n 's/^clientPort=//p' "$here/zookeeper.cfg" | tail -n1)}
if [ -n "${FJORD_PORTS:-}" ]; then
  read -r -a ports <<<"$FJORD_PORTS"
  [ "${#ports[@]}" -eq 3 ] || die "FJORD_PORTS needs three ports, got: $FJORD_PORTS"
else
  ports=("$(config_port "$here/broker-1.toml")" "$(config_port "$here/broker-2.toml")" "$(config_port "$here/broker-3.toml")")
fi

# `true` when something accepts connections on 127.0.0.1:$1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# `true` when the pid in file $1 is a live process.
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

for port in "$zk_port" "${ports[@]}"; do
  if listening "$port"; then
    die "port $port is taken (already running? deploy/cluster/stop.sh $data); or choose ports with ZK_PORT / FJORD_PORTS"
  fi
done

# --- ZooKeeper --------------------------------------------------------------------------
mkdir -p "$data/zookeeper/data"
{
  cat "$here/zookeeper.cfg"
  echo "dataDir=$data/zookeeper/data"
  echo "clientPort=$zk_port"
} >"$data/zookeeper/zoo.cfg"
nohup java -Xmx512m -cp "$zk_classpath" org.apache.zookeeper.server.ZooKeeperServerMain "$data/zookeeper/zoo.cfg" \
  >"$data/zookeeper/zookeeper.log" 2>&1 </dev/null &
echo $! >"$data/zookeeper.pid"
started=true

zk_serving() {
  local answer
  answer=$( (exec 3<>"/dev/tcp/127.0.0.1/$zk_port" && echo srvr >&3 && timeout 2 cat <&3) 2>/dev/null || true)
  [[ $answer == *Mode:* ]]
}
for _ in $(seq 1 300); do
  zk_serving && break
  alive "$data/zookeeper.pid" || die "ZooKeeper exited; see $data/zookeeper/zookeeper.log"
  sleep 0.1
done
zk_serving || die "ZooKeeper did not serve on port $zk_port within 30 s; see $data/zookeeper/zookeeper.log"
echo "ZooKeeper      127.0.0.1:$zk_port   (pid $(cat "$data/zookeeper.pid"), log $data/zookeeper/zookeeper.log)"

# --- brokers ----------------------------------------------------------------------------
for i in 1 2 3; do
  port=${ports[$((i - 1))]}
  args=(broker --config "$here/broker-$i.toml" --data-dir "$data/broker-$i" --zookeeper "127.0.0.1:$zk_port/fjord")
  [ -n "${FJORD_PORTS:-}" ] && args+=(--listen "127.0.0.1:$port")
  RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 nohup "$fjord" "${args[@]}" >"$data/broker-$i.log" 2>&1 </dev/null &
  echo $! >"$data/broker-$i.pid"
done
for i in 1 2 3; do
  port=${ports[$((i - 1))]}
  for _ in $(seq 1 300); do
    listening "$port" && break
    alive "$data/broker-$i.pid" || die "broker $i exited; see $data/broker-$i.log"
    sleep 0.1
  done
  listening "$port" || die "broker $i did not listen on port $port within 30 s; see $data/broker-$i.log"
  echo "broker $i       127.0.0.1:$port   (pid $(cat "$data/broker-$i.pid"), log $data/broker-$i.log)"
done

bootstrap="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
echo
echo "bootstrap servers: $bootstrap"
echo "  $fjord topics --bootstrap $bootstrap create --topic events --partitions 6 --replication-factor 3"
echo "  kcat -b $bootstrap -L"
echo "stop: $here/stop.sh $data"
