#!/usr/bin/env bash
# A 6-node Redis Cluster (3 masters, 3 replicas) on loopback, for the remote tier's tests,
# benchmark and local experiments (docs/remote.md).
#
#   scripts/redis-cluster.sh start DIR [BASE_PORT] [--secure]
#                                                    nodes on BASE_PORT..BASE_PORT+5
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
#
# --secure: the nodes serve TLS only (no plain port; tls-cluster and tls-replication on,
# client certificates required) and Redis ACLs: the default user is off, `admin` may do
# anything (the script, replication, tests' admin commands) and `kvtier` only what the
# remote tier sends (GET SET EXISTS PING ASKING CLUSTER SLOTS) on keys kvt:*. Everything
# is made at start under DIR and removed by `stop`, never kept in the tree:
#   DIR/tls/ca.crt                 a throwaway CA (its key is deleted once it has signed)
#   DIR/tls/server.{crt,key}       the nodes' certificate (IP 127.0.0.1, DNS localhost; also
#                                  their client certificate on the cluster bus)
#   DIR/tls/client.{crt,key}       a client certificate
#   DIR/kvtier.password            the kvtier user's password (mode 0600)
#   DIR/admin.password             admin's (mode 0600)
# Needs openssl (Debian: openssl).
set -euo pipefail

die() { echo "redis-cluster: $*" >&2; exit 1; }

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start|stop|nodes DIR [BASE_PORT]"

ports_of() {  # the ports recorded at start
  cat "$1/ports" 2>/dev/null || true
}

# redis-cli for the cluster in $dir, as admin over TLS in secure mode, stopped after 60 s;
# `cli PORT ARGS` asks one node.
rcli() {
  if [ -f "$dir/secure.conf" ]; then
    REDISCLI_AUTH="$(cat "$dir/admin.password")" timeout 60 redis-cli --tls --cacert "$dir/tls/ca.crt" \
      --cert "$dir/tls/client.crt" --key "$dir/tls/client.key" --user admin "$@"
  else
    timeout 60 redis-cli "$@"
  fi
}
cli() {
  local p="$1"
  shift
  rcli -p "$p" -h 127.0.0.1 "$@"
}

# Secure mode's files: CA, certificates, passwords, the nodes' config (see the top).
make_secure() {
  local d="$1" t="$1/tls"
  command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
  mkdir -p "$t"
  (
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj "/CN=kvtier test CA" -keyout "$t/ca.key" -out "$t/ca.crt" 2>/dev/null
    for who in server client; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=kvtier test $who" -keyout "$t/$who.key" -out "$t/$who.csr" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' \
        "$([ "$who" = server ] && echo serverAuth,clientAuth || echo clientAuth)" >"$t/$who.ext"
      openssl x509 -req -in "$t/$who.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial -days 2 \
        -extfile "$t/$who.ext" -out "$t/$who.crt" 2>/dev/null
      rm -f "$t/$who.csr" "$t/$who.ext"
    done
    rm -f "$t/ca.key" "$t/ca.srl"
    openssl rand -hex 24 >"$d/kvtier.password"
    openssl rand -hex 24 >"$d/admin.password"
    admin="$(cat "$d/admin.password")"
    kvtier="$(cat "$d/kvtier.password")"
    cat >"$d/secure.conf" <<EOF
tls-cert-file $t/server.crt
tls-key-file $t/server.key
tls-ca-cert-file $t/ca.crt
tls-auth-clients yes
tls-cluster yes
tls-replication yes
user default off
user admin on >$admin ~* &* +@all
user kvtier on >$kvtier ~kvt:* resetchannels -@all +get +set +exists +ping +asking +cluster|slots
masteruser admin
masterauth $admin
EOF
  ) || die "could not make the TLS files and passwords under $d"
  [ -s "$t/server.crt" ] && [ -s "$t/client.crt" ] || die "openssl did not make the certificates under $t"
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
    secure=0
    [ "${4:-}" = "--secure" ] && secure=1
    [ -z "${4:-}" ] || [ "$secure" = 1 ] || die "unknown option '${4}' (--secure)"
    command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
    command -v redis-cli >/dev/null || die "redis-cli not found (apt-get install redis-tools)"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"  # absolute: the nodes' config files name files under it
    ports=""
    for i in 0 1 2 3 4 5; do ports="$ports $((base + i))"; done
    echo "$ports" >"$dir/ports"
    for p in $ports; do
      # Any listener (a TLS node refuses a plain PING, but takes the connection).
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        stop_nodes "$dir"
        die "port $p is already in use (another redis?); pick another BASE_PORT"
      fi
      mkdir -p "$dir/$p"
    done
    [ "$secure" = 1 ] && make_secure "$dir"
    for p in $ports; do
      # Plain: the port. Secure: make_secure's config file and TLS on the port only.
      if [ "$secure" = 1 ]; then
        listen=("$dir/secure.conf" --port 0 --tls-port "$p")
      else
        listen=(--port "$p")
      fi
      # No RDB/AOF: a cache. No diskless-sync delay: replicas are in sync within a second.
      # cluster-node-timeout is short so that a killed master's
      # replica takes over in a couple of seconds (the failover test relies on it).
      if ! redis-server "${listen[@]}" --bind 127.0.0.1 --cluster-enabled yes \
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
        cli "$p" PING >/dev/null 2>&1 && break
        sleep 0.05
      done
      cli "$p" PING >/dev/null 2>&1 || { stop_nodes "$dir"; die "node $p does not answer PING"; }
    done
    addrs=""
    for p in $ports; do addrs="$addrs 127.0.0.1:$p"; done
    # shellcheck disable=SC2086
    if ! rcli --cluster create $addrs --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
      stop_nodes "$dir"
      die "redis-cli --cluster create failed (see $dir/create.log)"
    fi
    ok=0
    for _ in $(seq 200); do
      ok=1
      for p in $ports; do
        info="$(cli "$p" CLUSTER INFO 2>/dev/null || true)"
        echo "$info" | grep -q "cluster_state:ok" || ok=0
        echo "$info" | grep -q "cluster_slots_ok:16384" || ok=0
      done
      [ "$ok" = 1 ] && break
      sleep 0.05
    done
    [ "$ok" = 1 ] || { stop_nodes "$dir"; die "cluster_state did not become ok within 10 s"; }
    cli "$base" CLUSTER NODES
    ;;
  stop)
    stop_nodes "$dir"
    rm -rf "$dir"
    ;;
  nodes)
    p="$(ports_of "$dir" | awk '{print $1}')"
    [ -n "$p" ] || die "no cluster recorded under $dir"
    cli "$p" CLUSTER NODES
    ;;
  *)
    die "unknown command '$cmd' (start|stop|nodes)"
    ;;
esac
