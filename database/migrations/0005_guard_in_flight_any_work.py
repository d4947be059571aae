"""The guard's ``in_flight`` reading of a target counts any work of the product on it, not
only a chunk's DELETE: a session of the product (``application_name`` ``retention…``, other
than the sampler's own) holding any lock on the table — the planner's reads of a window's
bounds, the verification's count, a chunk transaction. An idle reading taken while the run
plans its first window, or reads above its last key, is the run's own load, and an idle
baseline learnt from it (at a run's start, when the first sample takes its idle probes) let
the run's later readings pass as a fraction of it."""

from django.db import migrations

FUNCTION = r"""
CREATE OR REPLACE FUNCTION guard_table_signals(target regclass, modes text[])
    RETURNS TABLE (in_flight boolean, lock_waits bigint, conflicting_locks text[],
                   autovacuum_running boolean)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                   WHERE l.relation = target AND l.granted AND {work}
                     AND l.pid <> pg_backend_pid() AND a.application_name LIKE 'retention%'),
           (SELECT count(*) FROM pg_locks WHERE relation = target AND NOT granted),
           ARRAY(SELECT l.mode || ' by pid ' || l.pid FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.relation = target AND l.granted AND l.mode = ANY(modes)
                   AND coalesce(a.application_name, '') NOT LIKE 'retention%' LIMIT 3),
           EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = target)
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("database", "0004_run_rollout_fixed")]

    operations = [
        migrations.RunSQL(
            FUNCTION.replace("{work}", "l.locktype = 'relation'"),
            reverse_sql=FUNCTION.replace("{work}", "l.mode = 'RowExclusiveLock'"),
        )
    ]
