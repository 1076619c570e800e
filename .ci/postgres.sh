#!/usr/bin/env bash
# PostgreSQL for tidings-sql's tests: the Debian package `postgresql` (its binaries in
# /usr/lib/postgresql/<version>/bin). Idempotent: nothing happens when initdb is there.
# The tests start their own throwaway clusters (crates/tidings-testkit/src/postgres.rs).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
fi
ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null || command -v initdb
