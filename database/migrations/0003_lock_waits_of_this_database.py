"""The guard's instance reading counts the lock waits of this database only: a chunk of the
product can only make a session of its own database wait, and sessions waiting in another
database of the same server (another application's, or a test's) are no sign of harm done
here. Connections stay counted over the whole server, whose limit they share."""

from django.db import migrations

FUNCTION = r"""
CREATE OR REPLACE FUNCTION guard_instance_signals()
    RETURNS TABLE (connections_used bigint, max_connections integer, lock_waits bigint,
                   replication_lag_s double precision, replication_lag_bytes numeric,
                   replicas bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
           current_setting('max_connections')::integer,
           (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
             AND datname = current_database()
             AND coalesce(application_name, '') NOT LIKE 'retention%'),
           r.lag_s, r.lag_bytes, r.replicas
    FROM (SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::double precision AS lag_s,
                 coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0) AS lag_bytes,
                 count(*) AS replicas
          FROM pg_stat_replication) r
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("database", "0002_detached_partitions")]

    operations = [
        migrations.RunSQL(
            FUNCTION,
            reverse_sql=FUNCTION.replace("             AND datname = current_database()\n", ""),
        )
    ]
