-- Mastodon: statuses (posts; a reblog row points at its original) and the accounts they belong to
-- Repository: https://github.com/mastodon/mastodon
-- Path: db/schema.rb (create_table "statuses"; add_foreign_key "statuses", …)
-- Commit: 0070a2071a1d836cc6005ddb79d92ecbef998aed
-- Rails' PostgreSQL DDL for schema.rb: t.datetime precision: nil -> timestamp without time zone,
-- t.string -> character varying, t.bigint array: true -> bigint[]. The id default
-- timestamp_id('statuses') (a plpgsql function of Mastodon's) is left out: the fill gives ids.
-- The two self-references have no name in schema.rb (Rails derives fk_rails_<hash>); they are
-- named here after PostgreSQL's convention. accounts is cut down to its primary key and username (only statuses' keys reference it).
CREATE TABLE accounts (
    id bigint PRIMARY KEY,
    username character varying DEFAULT ''::character varying NOT NULL
);

CREATE TABLE statuses (
    id bigint NOT NULL PRIMARY KEY,
    uri character varying,
    text text DEFAULT ''::text NOT NULL,
    created_at timestamp without time zone NOT NULL,
    updated_at timestamp without time zone NOT NULL,
    in_reply_to_id bigint,
    reblog_of_id bigint,
    url character varying,
    sensitive boolean DEFAULT false NOT NULL,
    visibility integer DEFAULT 0 NOT NULL,
    spoiler_text text DEFAULT ''::text NOT NULL,
    reply boolean DEFAULT false NOT NULL,
    language character varying,
    conversation_id bigint,
    local boolean,
    account_id bigint NOT NULL,
    application_id bigint,
    in_reply_to_account_id bigint,
    poll_id bigint,
    deleted_at timestamp without time zone,
    edited_at timestamp without time zone,
    trendable boolean,
    ordered_media_attachment_ids bigint[],
    fetched_replies_at timestamp(6) without time zone,
    quote_approval_policy integer DEFAULT 0 NOT NULL
);
CREATE INDEX index_statuses_20190820 ON statuses USING btree (account_id, id DESC, visibility, updated_at) WHERE (deleted_at IS NULL);
CREATE INDEX index_statuses_on_account_id ON statuses USING btree (account_id);
CREATE INDEX index_statuses_on_conversation_id ON statuses USING btree (conversation_id);
CREATE INDEX index_statuses_on_deleted_at ON statuses USING btree (deleted_at) WHERE (deleted_at IS NOT NULL);
CREATE INDEX index_statuses_local_20190824 ON statuses USING btree (id DESC, account_id) WHERE ((local OR (uri IS NULL)) AND (deleted_at IS NULL) AND (visibility = 0) AND (reblog_of_id IS NULL) AND ((NOT reply) OR (in_reply_to_account_id = account_id)));
CREATE INDEX index_statuses_public_20250129 ON statuses USING btree (id DESC, language, account_id) WHERE ((deleted_at IS NULL) AND (visibility = 0) AND (reblog_of_id IS NULL) AND ((NOT reply) OR (in_reply_to_account_id = account_id)));
CREATE INDEX index_statuses_on_in_reply_to_account_id ON statuses USING btree (in_reply_to_account_id) WHERE (in_reply_to_account_id IS NOT NULL);
CREATE INDEX index_statuses_on_in_reply_to_id ON statuses USING btree (in_reply_to_id) WHERE (in_reply_to_id IS NOT NULL);
CREATE INDEX index_statuses_on_reblog_of_id_and_account_id ON statuses USING btree (reblog_of_id, account_id);
CREATE UNIQUE INDEX index_statuses_on_uri ON statuses USING btree (uri text_pattern_ops) WHERE (uri IS NOT NULL);

ALTER TABLE statuses ADD CONSTRAINT fk_c7fa917661 FOREIGN KEY (in_reply_to_account_id) REFERENCES accounts(id) ON DELETE SET NULL;
ALTER TABLE statuses ADD CONSTRAINT fk_9bda1543f7 FOREIGN KEY (account_id) REFERENCES accounts(id) ON DELETE CASCADE;
ALTER TABLE statuses ADD CONSTRAINT statuses_in_reply_to_id_fkey FOREIGN KEY (in_reply_to_id) REFERENCES statuses(id) ON DELETE SET NULL;
ALTER TABLE statuses ADD CONSTRAINT statuses_reblog_of_id_fkey FOREIGN KEY (reblog_of_id) REFERENCES statuses(id) ON DELETE CASCADE;
