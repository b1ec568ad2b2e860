#!/bin/sh
# Makes the secret files compose.yaml mounts, in deploy/secrets/ (see docs/deployment.md). A file that
# exists is kept, so running it again changes nothing; delete a file to make a new secret.
#
#   sh deploy/make-secrets.sh
#
# The folder is 0700, so other users of this machine cannot read it. The files in it are 0644: Compose
# mounts each file itself into the containers, where the gateways (uid 1000) and PostgreSQL (uid 999)
# must be able to read it.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets

# write NAME VALUE: deploy/secrets/NAME holds VALUE and a newline, unless it exists.
write() {
  if [ -s "secrets/$1" ]; then
    echo "kept    deploy/secrets/$1"
    return
  fi
  printf '%s\n' "$2" >"secrets/$1.new"
  chmod 644 "secrets/$1.new"
  mv "secrets/$1.new" "secrets/$1"
  echo "created deploy/secrets/$1"
}

# Hex: nothing to escape inside the database URL.
write postgres_password "$(openssl rand -hex 24)"
write tds_database_url "postgres://tds:$(cat secrets/postgres_password)@postgres:5432/tds"
write tds_metrics_token "$(openssl rand -hex 32)"
write tds_admin_token "$(openssl rand -base64 32)"
