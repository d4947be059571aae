"""The database side of the trust boundary (docs/security.md):

- ``guard_instance_signals()`` and ``guard_table_signals(target, modes)``: the admission
  guard's readings of other sessions (lock waits, replication lag, conflicting locks,
  autovacuum), as aggregates, through ``SECURITY DEFINER`` functions owned by the product's
  owner. The workers' login needs no ``pg_monitor`` and sees no other session's SQL text.
- ``rr_may_decide()``: whether the current role may make an operator's decision (it may
  change the kill switch). Roles that may not — the cleanup workers — cannot undo one:
  a policy's pause, schedule or enablement (the guard may only pause an unpaused policy for a
  critical reading, and lift its own pause), and a run an operator paused, cancelled or holds
  for confirmation (the reconciler may only expire an unconfirmed run).
- A run's identity and scope never change once written, whoever updates the row.
"""

from django.db import migrations

SQL = r"""
CREATE FUNCTION guard_instance_signals()
    RETURNS TABLE (connections_used bigint, max_connections integer, lock_waits bigint,
                   replication_lag_s double precision, replication_lag_bytes numeric,
                   replicas bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
           current_setting('max_connections')::integer,
           (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
             AND coalesce(application_name, '') NOT LIKE 'retention%'),
           r.lag_s, r.lag_bytes, r.replicas
    FROM (SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::double precision AS lag_s,
                 coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0) AS lag_bytes,
                 count(*) AS replicas
          FROM pg_stat_replication) r
$$;

CREATE FUNCTION guard_table_signals(target regclass, modes text[])
    RETURNS TABLE (in_flight boolean, lock_waits bigint, conflicting_locks text[],
                   autovacuum_running boolean)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                   WHERE l.relation = target AND l.granted AND l.mode = 'RowExclusiveLock'
                     AND l.pid <> pg_backend_pid() AND a.application_name LIKE 'retention%'),
           (SELECT count(*) FROM pg_locks WHERE relation = target AND NOT granted),
           ARRAY(SELECT l.mode || ' by pid ' || l.pid FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.relation = target AND l.granted AND l.mode = ANY(modes)
                   AND coalesce(a.application_name, '') NOT LIKE 'retention%' LIMIT 3),
           EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = target)
$$;

REVOKE ALL ON FUNCTION guard_instance_signals() FROM PUBLIC;
REVOKE ALL ON FUNCTION guard_table_signals(regclass, text[]) FROM PUBLIC;

CREATE FUNCTION rr_may_decide() RETURNS boolean
    LANGUAGE sql STABLE SET search_path = {schema}, pg_catalog, pg_temp AS $$
    SELECT has_table_privilege(current_user, {killswitch}::regclass, 'UPDATE')
$$;

CREATE FUNCTION rr_policy_decisions() RETURNS trigger LANGUAGE plpgsql
    SET search_path = {schema}, pg_catalog, pg_temp AS $$
BEGIN
    IF rr_may_decide() THEN
        RETURN NEW;
    END IF;
    IF to_jsonb(NEW) - 'paused' - 'paused_reason'
            IS DISTINCT FROM to_jsonb(OLD) - 'paused' - 'paused_reason' THEN
        RAISE EXCEPTION 'role % may not change policy %: only operators change policies',
            current_user, OLD.slug USING ERRCODE = '42501';
    END IF;
    IF (NEW.paused, NEW.paused_reason) IS NOT DISTINCT FROM (OLD.paused, OLD.paused_reason)
       OR (NOT OLD.paused AND NEW.paused AND NEW.paused_reason LIKE 'guard critical%')
       OR (OLD.paused AND NOT NEW.paused AND OLD.paused_reason LIKE 'guard critical%') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'role % may not change the pause of policy %: an operator decided it',
        current_user, OLD.slug USING ERRCODE = '42501';
END;
$$;

CREATE TRIGGER retention_policy_decisions BEFORE UPDATE ON retention_policy
    FOR EACH ROW EXECUTE FUNCTION rr_policy_decisions();

CREATE FUNCTION rr_run_decisions() RETURNS trigger LANGUAGE plpgsql
    SET search_path = {schema}, pg_catalog, pg_temp AS $$
BEGIN
    IF (NEW.run_key, NEW.policy_id, NEW.policy_version_id, NEW.tick, NEW.cutoff)
            IS DISTINCT FROM (OLD.run_key, OLD.policy_id, OLD.policy_version_id, OLD.tick, OLD.cutoff) THEN
        RAISE EXCEPTION 'run %: its key, policy version, tick and cutoff never change', OLD.run_key
            USING ERRCODE = '42501';
    END IF;
    IF NEW.state = OLD.state OR rr_may_decide() THEN
        RETURN NEW;
    END IF;
    IF OLD.state IN ('paused', 'cancelled')
       OR (OLD.state = 'confirm' AND NEW.state <> 'expired') THEN
        RAISE EXCEPTION 'role % may not move run % out of %: an operator decided it',
            current_user, OLD.run_key, OLD.state USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER runs_run_decisions BEFORE UPDATE ON runs_run
    FOR EACH ROW EXECUTE FUNCTION rr_run_decisions();
"""

REVERSE = """
DROP TRIGGER IF EXISTS runs_run_decisions ON runs_run;
DROP TRIGGER IF EXISTS retention_policy_decisions ON retention_policy;
DROP FUNCTION IF EXISTS rr_run_decisions();
DROP FUNCTION IF EXISTS rr_policy_decisions();
DROP FUNCTION IF EXISTS rr_may_decide();
DROP FUNCTION IF EXISTS guard_table_signals(regclass, text[]);
DROP FUNCTION IF EXISTS guard_instance_signals();
"""


def create(apps, schema_editor):
    # The functions name the product's schema (settings.DB_SCHEMA) and the kill switch's
    # table by OID: a session's own temporary objects (searched first otherwise) or search
    # path can never stand in for them.
    from django.conf import settings  # the schema configured for this installation
    from psycopg import sql

    schema = settings.DB_SCHEMA
    statement = sql.SQL(SQL).format(
        schema=sql.Identifier(schema), killswitch=sql.Literal(f"{schema}.retention_killswitch")
    )
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(statement.as_string(cursor.connection))


def drop(apps, schema_editor):
    schema_editor.execute(REVERSE)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0019_try_slot"),
        ("retention", "0004_operator_action_moved_to_core"),
        ("core", "0004_oplog_target_index"),
    ]
    operations = [migrations.RunPython(create, drop)]
