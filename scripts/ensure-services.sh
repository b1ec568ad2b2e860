#!/usr/bin/env bash
# Starts what the test suite needs on this machine, if it is not running yet: PostgreSQL (127.0.0.1:5432,
# trust auth, user postgres, database test) and Redis (127.0.0.1:6379), and installs Debian's Chromium
# for the browser tests. Installs from Debian's packages when missing (needs root). Fails with a clear
# message when it cannot.
set -euo pipefail

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() {
  # Waits for another package manager run (unattended upgrades, a second install) instead of failing at once.
  if [ "$apt_updated" -eq 0 ]; then as_root apt-get -o DPkg::Lock::Timeout=300 update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get -o DPkg::Lock::Timeout=300 install -y -qq "$@" >/dev/null
}

wait_for() { # command, what
  for _ in $(seq 1 60); do
    if eval "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "ensure-services: $2 did not become ready" >&2
  return 1
}

# PostgreSQL
# The server binaries too: test/faults/postgres-restart.test.ts runs initdb and pg_ctl for a private cluster.
if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "ensure-services: installing PostgreSQL" >&2
  apt_install postgresql
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "ensure-services: starting PostgreSQL" >&2
  version=$(ls /etc/postgresql | sort -n | tail -1)
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for "pg_isready -h 127.0.0.1 -p 5432 -q" "PostgreSQL on 127.0.0.1:5432"
fi
if ! psql -h 127.0.0.1 -U postgres -d postgres -Atqc "select 1" >/dev/null 2>&1; then
  # A fresh Debian install asks for a password on TCP: allow trust auth from loopback for the tests.
  hba=$(ls /etc/postgresql/*/main/pg_hba.conf | head -1)
  echo "ensure-services: enabling trust auth for 127.0.0.1 in $hba" >&2
  as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -n | tail -1)" main reload
  wait_for "psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1'" "PostgreSQL trust auth"
fi
if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "select count(*) from pg_database where datname = 'test'")" = "0" ]; then
  psql -h 127.0.0.1 -U postgres -d postgres -qc "create database test" >/dev/null
fi

# Redis
if ! command -v redis-server >/dev/null 2>&1; then
  echo "ensure-services: installing Redis" >&2
  apt_install redis-server
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
  echo "ensure-services: starting Redis" >&2
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for "redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG" "Redis on 127.0.0.1:6379"
fi

# Chromium for the browser tests (Debian's package; no tool may download a browser of its own)
if [ ! -x /usr/bin/chromium ]; then
  echo "ensure-services: installing Chromium" >&2
  apt_install chromium
fi

echo "ensure-services: PostgreSQL, Redis and Chromium are ready" >&2
