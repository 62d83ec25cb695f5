#!/usr/bin/env bash
# A 6-node Redis Cluster (3 masters, 3 replicas) on loopback, for the remote tier's tests,
# benchmark and local experiments (docs/remote.md).
#
#   scripts/redis-cluster.sh start DIR [BASE_PORT]   nodes on BASE_PORT..BASE_PORT+5
#                                                    (default 7000), files under DIR
#   scripts/redis-cluster.sh stop DIR                stops every node started in DIR
#                                                    and removes DIR
#   scripts/redis-cluster.sh nodes DIR               prints CLUSTER NODES
#
# `start` waits until every node reports cluster_state:ok and every slot is covered, then
# prints the nodes and exits 0; any failure stops what it started and exits 1 with one
# line saying why. Nodes are plain redis-server processes (daemonized, no persistence,
# pid files under DIR); `stop` kills exactly those pids. Needs redis-server and redis-cli
# (Debian: redis-server, redis-tools; scripts/install-deps.sh installs them).
set -euo pipefail

die() { echo "redis-cluster: $*" >&2; exit 1; }

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start|stop|nodes DIR [BASE_PORT]"

ports_of() {  # the ports recorded at start
  cat "$1/ports" 2>/dev/null || true
}

alive() {  # a running process (a zombie, killed but not yet reaped, is not)
  local st
  st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  st="${st##*) }"
  [ "${st%% *}" != Z ]
}

stop_nodes() {
  local d="$1" p pid
  for p in $(ports_of "$d"); do
    if [ -f "$d/$p/redis.pid" ]; then
      pid="$(cat "$d/$p/redis.pid")"
      kill "$pid" 2>/dev/null || true
    fi
  done
  # Wait (bounded) for them to go, then insist.
  for _ in $(seq 50); do
    local alive=0
    for p in $(ports_of "$d"); do
      [ -f "$d/$p/redis.pid" ] && alive "$(cat "$d/$p/redis.pid")" && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in $(ports_of "$d"); do
    [ -f "$d/$p/redis.pid" ] && kill -9 "$(cat "$d/$p/redis.pid")" 2>/dev/null || true
  done
}

case "$cmd" in
  start)
    base="${3:-7000}"
    command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
    command -v redis-cli >/dev/null || die "redis-cli not found (apt-get install redis-tools)"
    mkdir -p "$dir"
    ports=""
    for i in 0 1 2 3 4 5; do ports="$ports $((base + i))"; done
    echo "$ports" >"$dir/ports"
    for p in $ports; do
      if redis-cli -p "$p" -h 127.0.0.1 PING >/dev/null 2>&1; then
        stop_nodes "$dir"
        die "port $p is already served by another redis; pick another BASE_PORT"
      fi
      mkdir -p "$dir/$p"
      # No RDB/AOF: a cache. No diskless-sync delay: replicas are in sync within a second.
      # cluster-node-timeout is short so that a killed master's
      # replica takes over in a couple of seconds (the failover test relies on it).
      if ! redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
          --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 1000 \
          --cluster-replica-validity-factor 0 --save "" --appendonly no \
          --repl-diskless-sync-delay 0 \
          --dir "$dir/$p" --daemonize yes --pidfile "$dir/$p/redis.pid" \
          --logfile "$dir/$p/redis.log" --protected-mode no >/dev/null; then
        stop_nodes "$dir"
        die "redis-server on port $p did not start (see $dir/$p/redis.log)"
      fi
    done
    for p in $ports; do
      for _ in $(seq 100); do
        redis-cli -p "$p" -h 127.0.0.1 PING >/dev/null 2>&1 && break
        sleep 0.05
      done
      redis-cli -p "$p" -h 127.0.0.1 PING >/dev/null 2>&1 || { stop_nodes "$dir"; die "node $p does not answer PING"; }
    done
    addrs=""
    for p in $ports; do addrs="$addrs 127.0.0.1:$p"; done
    # shellcheck disable=SC2086
    if ! redis-cli --cluster create $addrs --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
      stop_nodes "$dir"
      die "redis-cli --cluster create failed (see $dir/create.log)"
    fi
    ok=0
    for _ in $(seq 200); do
      ok=1
      for p in $ports; do
        info="$(redis-cli -p "$p" -h 127.0.0.1 CLUSTER INFO 2>/dev/null || true)"
        echo "$info" | grep -q "cluster_state:ok" || ok=0
        echo "$info" | grep -q "cluster_slots_ok:16384" || ok=0
      done
      [ "$ok" = 1 ] && break
      sleep 0.05
    done
    [ "$ok" = 1 ] || { stop_nodes "$dir"; die "cluster_state did not become ok within 10 s"; }
    redis-cli -p "$base" -h 127.0.0.1 CLUSTER NODES
    ;;
  stop)
    stop_nodes "$dir"
    rm -rf "$dir"
    ;;
  nodes)
    p="$(ports_of "$dir" | awk '{print $1}')"
    [ -n "$p" ] || die "no cluster recorded under $dir"
    redis-cli -p "$p" -h 127.0.0.1 CLUSTER NODES
    ;;
  *)
    die "unknown command '$cmd' (start|stop|nodes)"
    ;;
esac
