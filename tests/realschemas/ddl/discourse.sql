-- Discourse: user_visits (one row per user and day visited)
-- Repository: https://github.com/discourse/discourse
-- Path: app/models/user_visit.rb (its "Schema Information" annotation)
-- Commit: 09bc319fd4ae7db51477b0e7adc8b6f97b1a3024
-- Rails' PostgreSQL DDL for it: id integer primary key (serial), visited_at a date.
CREATE TABLE user_visits (
    id serial PRIMARY KEY,
    user_id integer NOT NULL,
    visited_at date NOT NULL,
    posts_read integer DEFAULT 0
);
CREATE UNIQUE INDEX index_user_visits_on_user_id_and_visited_at ON user_visits (user_id, visited_at);
