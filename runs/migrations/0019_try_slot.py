"""``runs_try_slot(namespace, keys)``: a concurrency ceiling's slot taken in SQL, so a chunk
transaction takes its global, policy and tenant slots inside the statement that reads its
admission instead of one round trip per key tried (``runs.engine.worker``).

Functions are executable by PUBLIC unless revoked; docs/least-privilege.sql grants EXECUTE to
the worker role explicitly as well."""

from django.db import migrations

SQL = """
CREATE FUNCTION runs_try_slot(namespace integer, keys integer[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
-- Try the transaction-level advisory locks (namespace, keys[1]), (namespace, keys[2]), ... in
-- order and stop at the first one granted: its position (1-based), or NULL when all are taken.
BEGIN
    FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
        IF pg_try_advisory_xact_lock(namespace, keys[i]) THEN
            RETURN i;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;
"""

REVERSE = "DROP FUNCTION IF EXISTS runs_try_slot(integer, integer[])"


class Migration(migrations.Migration):
    dependencies = [("runs", "0018_run_chunk_columns")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
