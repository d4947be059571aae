-- Synapse (Matrix homeserver): user_ips
-- Repository: https://github.com/element-hq/synapse
-- Path: synapse/storage/schema/main/full_schemas/72/full.sql.postgres (CREATE TABLE user_ips,
--       lines 911-918; its indexes, lines 1282-1285; no later delta changes the table)
-- Commit: a58ad44eb0ce3cc14153f921206f322e17339dc5
-- As written: no primary key; last_seen is bigint milliseconds since the epoch.
CREATE TABLE user_ips (
    user_id text NOT NULL,
    access_token text NOT NULL,
    device_id text,
    ip text NOT NULL,
    user_agent text NOT NULL,
    last_seen bigint NOT NULL
);
CREATE INDEX user_ips_device_id ON user_ips USING btree (user_id, device_id, last_seen);
CREATE INDEX user_ips_last_seen ON user_ips USING btree (user_id, last_seen);
CREATE INDEX user_ips_last_seen_only ON user_ips USING btree (last_seen);
CREATE UNIQUE INDEX user_ips_user_token_ip_unique_index ON user_ips USING btree (user_id, access_token, ip);
