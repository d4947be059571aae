-- A CRM's messages (Chatwoot's messages and attachments, csat_survey_responses; read receipts
-- and reactions as a chat server keeps them): four child tables cascade from a message, and a
-- reply references the message it answers with ON DELETE SET NULL
-- Repository: https://github.com/chatwoot/chatwoot
-- Path: db/schema.rb (create_table "messages", "attachments", "csat_survey_responses")
-- Commit: ff525f5612ff2edf1c67e59fbd8d48e0f0d69e2f
-- Licence: MIT (Chatwoot's community edition). The columns are schema.rb's; Rails keeps these
-- associations in the application, so the foreign keys — the four children ON DELETE CASCADE
-- and the reply's in_reply_to ON DELETE SET NULL (Chatwoot keeps it in content_attributes) —
-- are declared here as the CRM of the report declares them; message_reads and
-- message_reactions stand for a chat server's read receipts and reactions.
CREATE TABLE messages (
    id bigserial PRIMARY KEY,
    content text,
    account_id integer NOT NULL,
    inbox_id integer NOT NULL,
    conversation_id integer NOT NULL,
    message_type integer NOT NULL,
    created_at timestamp(6) without time zone NOT NULL,
    updated_at timestamp(6) without time zone NOT NULL,
    private boolean DEFAULT false NOT NULL,
    status integer DEFAULT 0,
    source_id character varying,
    content_type integer DEFAULT 0 NOT NULL,
    content_attributes json DEFAULT '{}',
    sender_type character varying,
    sender_id bigint,
    external_source_ids jsonb DEFAULT '{}',
    additional_attributes jsonb DEFAULT '{}',
    processed_message_content text,
    sentiment jsonb DEFAULT '{}',
    in_reply_to bigint REFERENCES messages (id) ON DELETE SET NULL
);
CREATE INDEX index_messages_on_account_id ON messages (account_id);
CREATE INDEX index_messages_on_conversation_id ON messages (conversation_id);
CREATE INDEX index_messages_on_created_at ON messages (created_at);
CREATE INDEX index_messages_on_in_reply_to ON messages (in_reply_to);

CREATE TABLE attachments (
    id serial PRIMARY KEY,
    file_type integer DEFAULT 0,
    external_url character varying,
    coordinates_lat double precision DEFAULT 0.0,
    coordinates_long double precision DEFAULT 0.0,
    message_id integer NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    account_id integer NOT NULL,
    created_at timestamp(6) without time zone NOT NULL,
    updated_at timestamp(6) without time zone NOT NULL,
    fallback_title character varying,
    extension character varying,
    meta jsonb DEFAULT '{}'
);
CREATE INDEX index_attachments_on_message_id ON attachments (message_id);

CREATE TABLE csat_survey_responses (
    id bigserial PRIMARY KEY,
    account_id bigint NOT NULL,
    conversation_id bigint NOT NULL,
    message_id bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    rating integer NOT NULL,
    feedback_message text,
    contact_id bigint NOT NULL,
    assigned_agent_id bigint,
    created_at timestamp(6) without time zone NOT NULL,
    updated_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_csat_survey_responses_on_message_id ON csat_survey_responses (message_id);

CREATE TABLE message_reads (
    message_id bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    user_id bigint NOT NULL,
    read_at timestamp(6) without time zone NOT NULL,
    PRIMARY KEY (message_id, user_id)
);

CREATE TABLE message_reactions (
    id bigserial PRIMARY KEY,
    message_id bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    user_id bigint NOT NULL,
    emoji character varying(32) NOT NULL
);
CREATE INDEX index_message_reactions_on_message_id ON message_reactions (message_id);
