#!/usr/bin/env bash
# Converts Fashion-MNIST into LMDB and LevelDB for the tests: make_testdata.sh TROUPE OUT_DIR.
# Idempotent: a finished conversion is marked and kept.
set -euo pipefail
troupe=$1
out=$2
for db in lmdb leveldb; do
  if [[ ! -f "$out/$db/.done" ]]; then
    rm -rf "$out/$db"
    "$troupe" convert fashion-mnist --out "$out/$db" --db "$db"
    touch "$out/$db/.done"
  fi
done
