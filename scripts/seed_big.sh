#!/usr/bin/env bash
# Seeds a large SKU table (and optionally a text-key `users` table) for the
# scale benchmarks of issue 32, in the database's own SQL (MariaDB's
# sequence engine, PostgreSQL's generate_series): far faster than
# `bloomgate seed`, which goes through the service's write path.
#
#   scripts/seed_big.sh mariadb|postgres COUNT DATABASE [users]
#
# The rows are synthetic (prices from a formula, not `catalogue_sku`'s hash);
# ids are 1..COUNT, users' keys are u000000001..  The database is dropped and
# created again. Seeding 10^8 SKUs takes minutes and about 12 GB of disk.
set -euo pipefail
backend=${1:?mariadb or postgres}
count=${2:?row count}
db=${3:?database name}
with_users=${4:-}
chunk=1000000

skus_ddl="CREATE TABLE skus (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, \
original_price BIGINT NOT NULL, seckill_price BIGINT NOT NULL, stock BIGINT NOT NULL, \
seckill_start BIGINT NOT NULL, seckill_end BIGINT NOT NULL, updated_at BIGINT NOT NULL)"
users_ddl="CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL, seq BIGINT NOT NULL)"

started=$(date +%s)
case "$backend" in
mariadb)
    m() { mariadb -uroot -h127.0.0.1 -P3306 "$@"; }
    m -e "DROP DATABASE IF EXISTS \`$db\`; CREATE DATABASE \`$db\`"
    m "$db" -e "$skus_ddl"
    [ -n "$with_users" ] && m "$db" -e "$users_ddl"
    for ((lo = 1; lo <= count; lo += chunk)); do
        hi=$((lo + chunk - 1 < count ? lo + chunk - 1 : count))
        m "$db" -e "SET unique_checks = 0; INSERT INTO skus SELECT seq, \
            CONCAT('Seckill item #', LPAD(seq, 6, '0')), 1000 + seq % 99000, \
            (1000 + seq % 99000) * (50 + seq % 40) DIV 100, seq % 1000, \
            1767225600 + (seq % 720) * 3600, 1767225600 + (seq % 720) * 3600 + 7200, 1767225600 \
            FROM seq_${lo}_to_${hi}"
        if [ -n "$with_users" ]; then
            m "$db" -e "SET unique_checks = 0; INSERT INTO users SELECT \
                CONCAT('u', LPAD(seq, 9, '0')), CONCAT('user ', seq), seq FROM seq_${lo}_to_${hi}"
        fi
        echo "  $hi rows ($(($(date +%s) - started)) s)" >&2
    done
    m "$db" -e "ANALYZE TABLE skus" >/dev/null
    [ -n "$with_users" ] && m "$db" -e "ANALYZE TABLE users" >/dev/null
    ;;
postgres)
    p() { psql -q -v ON_ERROR_STOP=1 -h127.0.0.1 -p5432 -U postgres "$@"; }
    p -d test -c "DROP DATABASE IF EXISTS \"$db\"" -c "CREATE DATABASE \"$db\""
    p -d "$db" -c "$skus_ddl"
    [ -n "$with_users" ] && p -d "$db" -c "$users_ddl"
    for ((lo = 1; lo <= count; lo += chunk)); do
        hi=$((lo + chunk - 1 < count ? lo + chunk - 1 : count))
        p -d "$db" -c "INSERT INTO skus SELECT g, 'Seckill item #' || lpad(g::text, 6, '0'), \
            1000 + g % 99000, (1000 + g % 99000) * (50 + g % 40) / 100, g % 1000, \
            1767225600 + (g % 720) * 3600, 1767225600 + (g % 720) * 3600 + 7200, 1767225600 \
            FROM generate_series($lo, $hi) g"
        if [ -n "$with_users" ]; then
            p -d "$db" -c "INSERT INTO users SELECT 'u' || lpad(g::text, 9, '0'), 'user ' || g, g \
                FROM generate_series($lo, $hi) g"
        fi
        echo "  $hi rows ($(($(date +%s) - started)) s)" >&2
    done
    p -d "$db" -c "VACUUM ANALYZE skus"
    [ -n "$with_users" ] && p -d "$db" -c "VACUUM ANALYZE users"
    ;;
*)
    echo "unknown backend $backend (mariadb or postgres)" >&2
    exit 2
    ;;
esac
echo "seeded $count rows into $backend database $db in $(($(date +%s) - started)) s" >&2
