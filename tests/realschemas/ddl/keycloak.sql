-- Keycloak: ADMIN_EVENT_ENTITY (one row per administrative change, stored when a realm saves
-- admin events)
-- Repository: https://github.com/keycloak/keycloak
-- Paths: model/jpa/src/main/resources/META-INF/jpa-changelog-1.3.0.xml
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
-- TEXT(25500) -> text; unquoted names fold to lower case. ADMIN_EVENT_TIME is milliseconds
-- since the epoch (System.currentTimeMillis()); REALM_ID is the realm's id. Later releases add a
-- DETAILS_JSON text column, left out here.
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
