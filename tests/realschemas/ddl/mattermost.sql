-- Mattermost: posts and reactions (each user's reactions to a post)
-- Repository: https://github.com/mattermost/mattermost
-- Paths: server/channels/db/migrations/postgres/000020_create_posts.up.sql
--          (commit 45b3110bf0701d44625d07c26a4be132172ad499),
--        server/channels/db/migrations/postgres/000016_create_reactions.up.sql
--          (commit 5c839440e3b0557e886e4046cae4913b9b5366b1)
-- The migrations' resulting DDL (the ADD COLUMN IF NOT EXISTS folded in, the DO blocks' end
-- state: fileids varchar(300), reactions' primary key (postid, userid, emojiname)). Times are
-- bigint milliseconds since the epoch. Mattermost declares no foreign keys: reactions are not
-- removed with their post.
CREATE TABLE posts (
    id VARCHAR(26) PRIMARY KEY,
    createat bigint,
    updateat bigint,
    deleteat bigint,
    userid VARCHAR(26),
    channelid VARCHAR(26),
    rootid VARCHAR(26),
    parentid VARCHAR(26),
    originalid VARCHAR(26),
    message VARCHAR(65535),
    type VARCHAR(26),
    props VARCHAR(8000),
    hashtags VARCHAR(1000),
    filenames VARCHAR(4000),
    fileids VARCHAR(300),
    hasreactions boolean,
    editat bigint,
    ispinned boolean,
    remoteid VARCHAR(26)
);
CREATE INDEX idx_posts_update_at ON posts(updateat);
CREATE INDEX idx_posts_create_at ON posts(createat);
CREATE INDEX idx_posts_delete_at ON posts(deleteat);
CREATE INDEX idx_posts_root_id ON posts(rootid);
CREATE INDEX idx_posts_user_id ON posts(userid);
CREATE INDEX idx_posts_is_pinned ON posts(ispinned);
CREATE INDEX idx_posts_channel_id_update_at ON posts(channelid, updateat);
CREATE INDEX idx_posts_channel_id_delete_at_create_at ON posts(channelid, deleteat, createat);
CREATE INDEX idx_posts_message_txt ON posts USING gin(to_tsvector('english', message));
CREATE INDEX idx_posts_hashtags_txt ON posts USING gin(to_tsvector('english', hashtags));

CREATE TABLE reactions (
    userid VARCHAR(26) NOT NULL,
    postid VARCHAR(26) NOT NULL,
    emojiname VARCHAR(64) NOT NULL,
    createat bigint,
    updateat bigint,
    deleteat bigint,
    remoteid VARCHAR(26),
    PRIMARY KEY (postid, userid, emojiname)
);
