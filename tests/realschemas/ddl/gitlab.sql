-- GitLab: web_hook_logs (one row per web hook delivery), range-partitioned by month
-- Repository: https://github.com/gitlabhq/gitlabhq (the GitHub mirror of gitlab-org/gitlab)
-- Path: db/structure.sql (CREATE TABLE web_hook_logs … PARTITION BY RANGE (created_at);
--       ALTER TABLE ONLY web_hook_logs ADD CONSTRAINT web_hook_logs_pkey;
--       index_web_hook_logs_on_web_hook_id_and_created_at,
--       index_web_hook_logs_part_on_created_at_and_web_hook_id)
-- Commit: 0016ea0586afbe89b5823f3fc254045ce7115af2
-- As written, in the scratch schema instead of public. The id sequence's default is not in
-- structure.sql for the parent (the application assigns ids); the fill gives them. GitLab's
-- partition manager (Gitlab::Database::Partitioning, monthly strategy) creates the partitions
-- web_hook_logs_YYYYMM in schema gitlab_partitions_dynamic, FOR VALUES FROM (first of the
-- month) TO (first of the next), and web_hook_logs_000000 FROM (MINVALUE) TO (the first
-- month); the fill makes them the same way. web_hooks is not loaded, so no foreign key from
-- web_hook_id is made (a reference from web_hook_logs to it could not cascade into it anyway).
CREATE TABLE web_hook_logs (
    id bigint NOT NULL,
    web_hook_id bigint NOT NULL,
    trigger character varying,
    url character varying,
    request_headers text,
    request_data text,
    response_headers text,
    response_body text,
    response_status character varying,
    execution_duration double precision,
    internal_error_message character varying,
    updated_at timestamp without time zone NOT NULL,
    created_at timestamp without time zone NOT NULL,
    url_hash text
)
PARTITION BY RANGE (created_at);

ALTER TABLE ONLY web_hook_logs
    ADD CONSTRAINT web_hook_logs_pkey PRIMARY KEY (id, created_at);

CREATE INDEX index_web_hook_logs_on_web_hook_id_and_created_at ON ONLY web_hook_logs USING btree (web_hook_id, created_at);

CREATE INDEX index_web_hook_logs_part_on_created_at_and_web_hook_id ON ONLY web_hook_logs USING btree (created_at, web_hook_id);
