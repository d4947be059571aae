-- Sentry: the node store (nodestore_node), event payloads keyed by random 32-character hex
-- ids (a text primary key that says nothing about age), as Django creates the model
-- Repository: https://github.com/getsentry/sentry
-- Path: src/sentry/nodestore/django/models.py (class Node: id CharField(max_length=40,
--       primary_key=True), data TextField, timestamp DateTimeField(db_index=True))
-- Commit: 1407862fd648f36d198396414094b0079e218ecc
-- Licence: FSL-1.1-Apache-2.0 (Functional Source License). The table as Django's migration
-- creates it on PostgreSQL.
CREATE TABLE nodestore_node (
    id character varying(40) NOT NULL PRIMARY KEY,
    data text NOT NULL,
    "timestamp" timestamp with time zone NOT NULL
);
CREATE INDEX nodestore_node_timestamp_375a0a5c ON nodestore_node ("timestamp");
CREATE INDEX nodestore_node_id_2f3ef3e9_like ON nodestore_node (id varchar_pattern_ops);
