-- Least privilege for the role the cleanup workers (qcluster, `retention drain`) connect as.
-- See docs/security.md. Run as the owner of the tables (the role that ran the migrations):
--
--   psql "$OWNER_DATABASE_URL" -v worker_role=retention_worker -v target=public.events \
--        -f docs/least-privilege.sql
--
-- Create the role first (CREATE ROLE retention_worker LOGIN PASSWORD '...'), repeat the
-- "target tables" grant for every table a policy deletes from, and give the workers
-- DATABASE_URL=postgresql://retention_worker:...@host/db. The web process and `migrate`
-- keep using the owner role. tests/security/test_least_privilege.py applies this file.
--
-- What the role can NOT do: any DDL (it owns nothing and has no CREATE on the database or
-- the schema), UPDATE / DELETE / TRUNCATE on the audit trail (runs_auditrecord,
-- retention_operatoraction), UPDATE or TRUNCATE on target tables, change policies' versions,
-- approvals or legal holds.

-- Connect and see the schema (on PostgreSQL <= 14 also: REVOKE CREATE ON SCHEMA public FROM PUBLIC).
GRANT CONNECT ON DATABASE :"DBNAME" TO :"worker_role";
GRANT USAGE ON SCHEMA public TO :"worker_role";

-- Target tables: read to plan and verify, delete rows. Nothing else.
GRANT SELECT, DELETE ON TABLE :target TO :"worker_role";
-- Only for a policy with vacuum = "run", on PostgreSQL 17 or later (docs/security.md): the
-- VACUUM (ANALYZE) after a drained run needs MAINTAIN (before 17, the table's owner):
--   GRANT MAINTAIN ON TABLE :target TO :"worker_role";

-- The ledger the workers write (FOR UPDATE needs UPDATE). The cleanup cluster also runs the
-- scheduled triggers and the reconciler, which create runs (catch-up) and prune guard samples.
GRANT SELECT, INSERT, UPDATE ON TABLE runs_run TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON TABLE runs_chunk TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON TABLE runs_plannercursor TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON TABLE runs_lease TO :"worker_role";
GRANT SELECT, INSERT ON TABLE runs_deadletter TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON TABLE runs_partitionaction TO :"worker_role";
GRANT SELECT, INSERT, DELETE ON TABLE runs_guardsample TO :"worker_role";

-- The audit trail: append only (SELECT for the chain head and INSERT ... RETURNING).
GRANT SELECT, INSERT ON TABLE runs_auditrecord TO :"worker_role";
GRANT SELECT, INSERT ON TABLE retention_operatoraction TO :"worker_role";

-- Policies are read; the guard may pause a policy at a critical level (UPDATE on the policy row).
GRANT SELECT, UPDATE ON TABLE retention_policy TO :"worker_role";
GRANT SELECT ON TABLE retention_policyversion TO :"worker_role";
GRANT SELECT ON TABLE retention_legalhold TO :"worker_role";
GRANT SELECT ON TABLE retention_killswitch TO :"worker_role";

-- django-q2: the ORM broker's queue, results and schedules (a schedule may only name the
-- product's scheduled tasks: a CHECK constraint), cluster stats in the cluster cache. No
-- grant on core_cache: that cache is the web process's own.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE django_q_ormq TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE django_q_task TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE django_q_schedule TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE core_cluster_cache TO :"worker_role";

-- The guard's signals (replication lag, other sessions' waits) need the monitoring role.
GRANT pg_monitor TO :"worker_role";

-- A chunk transaction takes its concurrency slots with the product's function (migration
-- runs 0019; PUBLIC may execute functions by default, this keeps working where that is revoked).
GRANT EXECUTE ON FUNCTION runs_try_slot(integer, integer[]) TO :"worker_role";
