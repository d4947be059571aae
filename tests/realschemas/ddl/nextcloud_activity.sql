-- Nextcloud Activity: oc_activity (the "activity" table with Nextcloud's default prefix "oc_")
-- Repository: https://github.com/nextcloud/activity
-- Paths: lib/Migration/Version2006Date20170808154933.php (createTable, indexes),
--        Version2007Date20181107114613.php, Version2010Date20190416112817.php (drops activity_time)
-- Commit: 8490bcc307c0c81e9a7d086cca0f3d4825462614
-- Doctrine DBAL's PostgreSQL platform writes: BIGINT autoincrement -> bigserial, Types::INTEGER
-- -> integer, Types::STRING length n -> varchar(n), Types::TEXT -> text. "timestamp" is integer
-- seconds since the epoch. Version2006Date20170808155040's activity_filter_app is commented out
-- upstream; the install creates activity_filter.
CREATE TABLE oc_activity (
    activity_id BIGSERIAL NOT NULL,
    "timestamp" INT DEFAULT 0 NOT NULL,
    priority INT DEFAULT 0 NOT NULL,
    type VARCHAR(255) DEFAULT NULL,
    "user" VARCHAR(64) DEFAULT NULL,
    affecteduser VARCHAR(64) NOT NULL,
    app VARCHAR(32) NOT NULL,
    subject VARCHAR(255) NOT NULL,
    subjectparams TEXT NOT NULL,
    message VARCHAR(255) DEFAULT NULL,
    messageparams TEXT DEFAULT NULL,
    file VARCHAR(4000) DEFAULT NULL,
    link VARCHAR(4000) DEFAULT NULL,
    object_type VARCHAR(255) DEFAULT NULL,
    object_id BIGINT DEFAULT 0 NOT NULL,
    PRIMARY KEY(activity_id)
);
CREATE INDEX activity_user_time ON oc_activity (affecteduser, "timestamp");
CREATE INDEX activity_filter_by ON oc_activity (affecteduser, "user", "timestamp");
CREATE INDEX activity_filter ON oc_activity (affecteduser, type, app, "timestamp");
CREATE INDEX activity_object ON oc_activity (object_type, object_id);
CREATE INDEX activity_object_user ON oc_activity (affecteduser, object_type, object_id, "timestamp");
