"""Two narrowings of what the worker login reaches through the database's own functions:

- ``rr_policy_decisions``: a role that may not decide (the cleanup workers) may still pause an
  unpaused policy for a critical guard reading, but lifts no pause at all. Its reason text
  ("guard critical…") is no proof of who paused: an on-call engineer may type the same words,
  and that pause is an operator's decision. The product never lifts a pause by itself — a
  person with the on-call role resumes a policy, the guard's pause included.
- ``guard_table_signals``: answers only for a table an approved policy version names (its
  ``schema`` and ``table``); for any other relation it is refused (42501), so the worker
  login cannot read other sessions' locks, waits or autovacuum on the application's other
  tables.
"""

from django.db import migrations

POLICY_DECISIONS = r"""
CREATE OR REPLACE FUNCTION rr_policy_decisions() RETURNS trigger LANGUAGE plpgsql
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
       OR (NOT OLD.paused AND NEW.paused AND NEW.paused_reason LIKE 'guard critical%') THEN
        RETURN NEW;
    END IF;
    IF OLD.paused THEN
        RAISE EXCEPTION 'role % may not lift or change the pause of policy %: an on-call '
            'engineer resumes it', current_user, OLD.slug USING ERRCODE = '42501';
    END IF;
    RAISE EXCEPTION 'role % may not change the pause of policy %: an operator decided it',
        current_user, OLD.slug USING ERRCODE = '42501';
END;
$$;
"""

POLICY_DECISIONS_BEFORE = POLICY_DECISIONS.replace(
    "       OR (NOT OLD.paused AND NEW.paused AND NEW.paused_reason LIKE 'guard critical%') THEN",
    "       OR (NOT OLD.paused AND NEW.paused AND NEW.paused_reason LIKE 'guard critical%')\n"
    "       OR (OLD.paused AND NOT NEW.paused AND OLD.paused_reason LIKE 'guard critical%') THEN",
)

TABLE_SIGNALS = r"""
CREATE OR REPLACE FUNCTION guard_table_signals(target regclass, modes text[])
    RETURNS TABLE (in_flight boolean, lock_waits bigint, conflicting_locks text[],
                   autovacuum_running boolean)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM {schema}.retention_policyversion v
        WHERE v.state = 'approved'
          AND to_regclass(format('%I.%I', coalesce(v.spec->>'schema', 'public'),
                                 v.spec->>'table')) = target
    ) THEN
        RAISE EXCEPTION 'guard_table_signals: % is not the table of an approved policy', target
            USING ERRCODE = '42501';
    END IF;
    RETURN QUERY
    SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                   WHERE l.relation = target AND l.granted AND l.locktype = 'relation'
                     AND l.pid <> pg_backend_pid() AND a.application_name LIKE 'retention%'),
           (SELECT count(*) FROM pg_locks WHERE relation = target AND NOT granted),
           ARRAY(SELECT l.mode || ' by pid ' || l.pid FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.relation = target AND l.granted AND l.mode = ANY(modes)
                   AND coalesce(a.application_name, '') NOT LIKE 'retention%' LIMIT 3),
           EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = target);
END;
$fn$;
"""

TABLE_SIGNALS_BEFORE = r"""
CREATE OR REPLACE FUNCTION guard_table_signals(target regclass, modes text[])
    RETURNS TABLE (in_flight boolean, lock_waits bigint, conflicting_locks text[],
                   autovacuum_running boolean)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                   WHERE l.relation = target AND l.granted AND l.locktype = 'relation'
                     AND l.pid <> pg_backend_pid() AND a.application_name LIKE 'retention%'),
           (SELECT count(*) FROM pg_locks WHERE relation = target AND NOT granted),
           ARRAY(SELECT l.mode || ' by pid ' || l.pid FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.relation = target AND l.granted AND l.mode = ANY(modes)
                   AND coalesce(a.application_name, '') NOT LIKE 'retention%' LIMIT 3),
           EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = target)
$$;
"""


def _run(schema_editor, text: str) -> None:
    # the product's schema named outright (settings.DB_SCHEMA), as in 0001
    from django.conf import settings
    from psycopg import sql

    statement = sql.SQL(text).format(schema=sql.Identifier(settings.DB_SCHEMA))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(statement.as_string(cursor.connection))


def forward(apps, schema_editor):
    _run(schema_editor, POLICY_DECISIONS + TABLE_SIGNALS)


def backward(apps, schema_editor):
    _run(schema_editor, POLICY_DECISIONS_BEFORE + TABLE_SIGNALS_BEFORE)


class Migration(migrations.Migration):
    dependencies = [("database", "0005_guard_in_flight_any_work")]
    operations = [migrations.RunPython(forward, backward)]
