-- Keycloak: EVENT_ENTITY (user events: logins, logouts, token exchanges, their errors) and
-- ADMIN_EVENT_ENTITY (administrative changes), stored when a realm saves events
-- Repository: https://github.com/keycloak/keycloak
-- Paths: model/jpa/src/main/resources/META-INF/jpa-changelog-1.0.0.Final.xml
--          (commit 12d2accf88ac7de18abc9ddf6f5d97a301f7f1f8): createTable EVENT_ENTITY,
--          addPrimaryKey CONSTRAINT_4,
--        model/jpa/src/main/resources/META-INF/jpa-changelog-1.1.0.Final.xml
--          (commit 67f2db38642f6249ffc25ce7a35c67968b88afe1): renameColumn TIME -> EVENT_TIME,
--        model/jpa/src/main/resources/META-INF/jpa-changelog-1.3.0.xml
--          (commit 45674063c520ee24eb264060ccdbe6ef768f0bfd): createTable ADMIN_EVENT_ENTITY,
--        model/jpa/src/main/resources/META-INF/jpa-changelog-3.4.0.xml
--          (commit 31fd74f3f3d13e9b8020e2c8d18ddc77a7fb56b8): addPrimaryKey
--          CONSTRAINT_ADMIN_EVENT_ENTITY,
--        model/jpa/src/main/resources/META-INF/jpa-changelog-18.0.0.xml
--          (commit 5ffdbd9bc6373efa2c52cd4eb6d5b54515fe22e0): changeSet
--          18.0.0-10625-IDX_ADMIN_EVENT_TIME,
--        model/jpa/src/main/java/org/keycloak/events/jpa/AdminEventEntity.java
--          (commit 6c0f685c397fd29458010f124b4ca9d26b31d057): RESOURCE_TYPE, length 64
-- Liquibase's PostgreSQL DDL for them: VARCHAR(n) -> character varying(n), BIGINT -> bigint,
-- TEXT(25500) -> text; unquoted names fold to lower case. EVENT_TIME and ADMIN_EVENT_TIME are
-- milliseconds since the epoch (System.currentTimeMillis()); REALM_ID is the realm's id. Later
-- releases add text columns for long details (EVENT_ENTITY.DETAILS_JSON_LONG_VALUE,
-- ADMIN_EVENT_ENTITY.DETAILS_JSON), left out here with any index on EVENT_ENTITY.
CREATE TABLE event_entity (
    id character varying(36) NOT NULL,
    client_id character varying(255),
    details_json character varying(2550),
    error character varying(255),
    ip_address character varying(255),
    realm_id character varying(255),
    session_id character varying(255),
    event_time bigint,
    type character varying(255),
    user_id character varying(255)
);
ALTER TABLE event_entity ADD CONSTRAINT constraint_4 PRIMARY KEY (id);

CREATE TABLE admin_event_entity (
    id character varying(36) NOT NULL,
    admin_event_time bigint,
    realm_id character varying(255),
    operation_type character varying(255),
    auth_realm_id character varying(255),
    auth_client_id character varying(255),
    auth_user_id character varying(255),
    ip_address character varying(255),
    resource_path character varying(2550),
    representation text,
    error character varying(255),
    resource_type character varying(64)
);
ALTER TABLE admin_event_entity ADD CONSTRAINT constraint_admin_event_entity PRIMARY KEY (id);
CREATE INDEX idx_admin_event_time ON admin_event_entity (realm_id, admin_event_time);
