"""A run's rollout stage and slice bound never change, like its key, version, tick and cutoff:
what a count run counted and what a slice run deleted are judged by them (docs/engine.md,
"States"). The run trigger's function, written again with the two columns."""

from django.db import migrations

SQL = """
CREATE OR REPLACE FUNCTION rr_run_decisions() RETURNS trigger LANGUAGE plpgsql
    SET search_path = {schema}, pg_catalog, pg_temp AS $$
BEGIN
    IF (NEW.run_key, NEW.policy_id, NEW.policy_version_id, NEW.tick, NEW.cutoff,
        NEW.rollout, NEW.slice_bound)
            IS DISTINCT FROM (OLD.run_key, OLD.policy_id, OLD.policy_version_id, OLD.tick,
                              OLD.cutoff, OLD.rollout, OLD.slice_bound) THEN
        RAISE EXCEPTION 'run %: its key, policy version, tick, cutoff, rollout stage and slice bound never change',
            OLD.run_key USING ERRCODE = '42501';
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
"""

PREVIOUS = """
CREATE OR REPLACE FUNCTION rr_run_decisions() RETURNS trigger LANGUAGE plpgsql
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
"""


def _run(text: str):
    def apply(apps, schema_editor):
        # the function names the product's schema (settings.DB_SCHEMA), as in 0001
        from django.conf import settings
        from psycopg import sql

        statement = sql.SQL(text).format(schema=sql.Identifier(settings.DB_SCHEMA))
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(statement.as_string(cursor.connection))

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("database", "0003_lock_waits_of_this_database"),
        ("runs", "0024_run_rollout_and_chunk_counts"),
    ]

    operations = [migrations.RunPython(_run(SQL), _run(PREVIOUS))]
