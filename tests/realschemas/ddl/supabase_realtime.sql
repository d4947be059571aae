-- Supabase Realtime: realtime.messages (broadcast and presence messages), partitioned by day
-- Repository: https://github.com/supabase/realtime
-- Paths: lib/realtime/tenants/repo/migrations/20241030150047_messages_partitioning.ex
--          (CREATE TABLE … PARTITION BY RANGE (inserted_at); realtime.send creates the daily
--          partitions messages_YYYY_MM_DD FOR VALUES FROM (day) TO (day + 1)),
--        20241108114728_messages_using_uuid.ex (id becomes uuid; PRIMARY KEY (id, inserted_at)),
--        20250905041441_create_messages_replay_index.ex (the partial replay index),
--        20260514120000_add_binary_payload_to_messages.ex (binary_payload, its CHECK)
-- Commit: 833cf36c3a3603fff5ae5a8a0ce473a21d5fedd4
-- The migrations' resulting DDL, in the scratch schema instead of "realtime"; the row-level
-- security policies, grants and owner changes are left out. Ecto names the index
-- messages_inserted_at_topic_index. inserted_at is UTC wall-clock time (timestamp without time
-- zone, default now() of a UTC session). Supabase's janitor drops the partitions of days older
-- than 72 hours (lib/realtime/messages.ex, delete_old_messages).
CREATE TABLE messages (
    topic TEXT NOT NULL,
    extension TEXT NOT NULL,
    payload JSONB,
    event TEXT,
    private BOOLEAN DEFAULT FALSE,
    updated_at TIMESTAMP NOT NULL DEFAULT NOW(),
    inserted_at TIMESTAMP NOT NULL DEFAULT NOW(),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    binary_payload bytea,
    PRIMARY KEY (id, inserted_at)
) PARTITION BY RANGE (inserted_at);
ALTER TABLE messages
  ADD CONSTRAINT messages_payload_exclusive
  CHECK (payload IS NULL OR binary_payload IS NULL) NOT VALID;
CREATE INDEX messages_inserted_at_topic_index ON messages (inserted_at DESC, topic)
  WHERE extension = 'broadcast' and private IS TRUE;
