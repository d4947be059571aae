"""The real-schema corpus: public projects' tables as they ship, each with the policy a real
administrator would write, drained by the real engine and judged table by table
(``tests.realschemas.corpus``). Times are relative to the tick, 2026-11-30 03:00 UTC."""

from __future__ import annotations

import pytest

from runs.models import Chunk, DeadLetter
from tests.realschemas.corpus import Case, Hold, run_case

# fmt: off
CASES = [
    Case(
        name="django", project="Django", ddl="django.sql",
        fill=(
            "INSERT INTO django_content_type (app_label, model)"
            " SELECT 'app' || (g / 10), 'model' || (g % 10) FROM generate_series(0, 39) g",
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email,"
            " is_staff, is_active, date_joined)"
            " SELECT '!', false, 'user' || g, '', '', 'user' || g || '@example.org', true, true,"
            " {T} - interval '3 years' FROM generate_series(1, 300) g",
            # 25,000 admin actions over two years; every 9th a deletion (flag 3)
            "INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag,"
            " change_message, content_type_id, user_id)"
            " SELECT {T} - (g * interval '41 minutes'), (g % 977)::text, 'Object ' || (g % 977),"
            " CASE WHEN g % 9 = 0 THEN 3 ELSE 1 + g % 2 END, '[]', 1 + g % 40, 1 + (g * 7) % 300"
            " FROM generate_series(1, 25000) g",
            # 30,000 sessions: expiry two weeks either side of the tick
            "INSERT INTO django_session (session_key, session_data, expire_date)"
            " SELECT left(md5('session' || g), 32), repeat('x', 120),"
            " {T} + ((g % 2880) - 1440) * interval '7 minutes' FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "django-sessions"
name = "Expired Django sessions"
table = "{schema}.django_session"
key = "session_key"
timestamp = "expire_date"
timestamp_is_expiry = true
retention = "0 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
            """
slug = "django-admin-log"
name = "Admin log older than a year, deletions kept"
table = "{schema}.django_admin_log"
key = "id"
timestamp = "action_time"
tenant = "user_id"
retention = "1 year"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "action_flag"
op = "="
value = 3
""",
        ),
        holds=(Hold("django-admin-log", tenant="7"),),
    ),
    Case(
        name="celery", project="django-celery-results", ddl="django_celery_results.sql",
        fill=(
            # 40,000 task results over 14 days; a few still pending, started or retrying
            "INSERT INTO django_celery_results_taskresult (task_id, status, content_type,"
            " content_encoding, result, date_done, task_name, worker, date_created)"
            " SELECT md5('task' || g)::uuid::text,"
            " CASE WHEN g % 97 = 0 THEN 'PENDING' WHEN g % 89 = 0 THEN 'RETRY'"
            " WHEN g % 13 = 0 THEN 'FAILURE' ELSE 'SUCCESS' END,"
            " 'application/json', 'utf-8', '{{\"ok\": true}}', {T} - (40000 - g) * interval '30 seconds',"
            " 'billing.tasks.' || (ARRAY['charge', 'refund', 'invoice'])[1 + g % 3],"
            " 'celery@worker' || (g % 4), {T} - (40000 - g) * interval '30 seconds' - interval '2 seconds'"
            " FROM generate_series(1, 40000) g",
        ),
        policies=(
            """
slug = "celery-results"
name = "Task results older than 7 days"
table = "{schema}.django_celery_results_taskresult"
key = "id"
timestamp = "date_done"
retention = "7 days"
chunk_size = 5000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "status"
op = "in"
values = ["PENDING", "STARTED", "RETRY"]
""",
        ),
        holds=(Hold("celery-results", key_from=1000, key_to=3000),),
    ),
    Case(
        name="nextcloud", project="Nextcloud Activity", ddl="nextcloud_activity.sql",
        fill=(
            # 30,000 activities over 500 days, integer seconds since the epoch
            "INSERT INTO oc_activity (\"timestamp\", type, \"user\", affecteduser, app, subject,"
            " subjectparams, object_type, object_id)"
            " SELECT ({T_S} - (30000 - g) * 1440)::int, 'file_changed',"
            " (ARRAY['alice', 'bob', 'carol', 'dave', 'Erin'])[1 + g % 5],"
            " (ARRAY['alice', 'bob', 'carol', 'dave', 'Erin', 'frank'])[1 + (g * 7) % 6],"
            " 'files', 'changed_self', '[]', 'files', g % 5000 FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "nextcloud-activity"
name = "Activity older than a year"
table = "{schema}.oc_activity"
key = "activity_id"
timestamp = "timestamp"
timestamp_unit = "s"
tenant = "affecteduser"
retention = "365 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("nextcloud-activity", tenant="carol"),),
    ),
    Case(
        name="synapse", project="Synapse", ddl="synapse.sql",
        fill=(
            # 30,000 (user, token, ip) rows last seen over 60 days, milliseconds since the epoch
            "INSERT INTO user_ips (user_id, access_token, device_id, ip, user_agent, last_seen)"
            " SELECT '@user' || (g % 400) || ':example.org', 'syt_' || md5('tok' || g),"
            " 'DEV' || (g % 900), '10.' || (g % 200) || '.' || (g % 250) || '.1', 'Element/1.11',"
            " {T_MS} - (g::bigint * 172800) FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "synapse-user-ips"
name = "Client IPs not seen for 28 days"
table = "{schema}.user_ips"
key = ["user_id", "access_token", "ip"]
timestamp = "last_seen"
timestamp_unit = "ms"
tenant = "user_id"
retention = "28 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("synapse-user-ips", tenant="@user7:example.org"),),
    ),
    Case(
        name="mattermost", project="Mattermost", ddl="mattermost.sql",
        fill=(
            # 30,000 posts over a year in 40 channels, ids of 26 characters, pinned now and then
            "INSERT INTO posts (id, createat, updateat, deleteat, userid, channelid, rootid,"
            " message, type, props, hashtags, filenames, ispinned)"
            " SELECT left(md5('post' || g), 26), {T_MS} - (30000 - g)::bigint * 1051200,"
            " {T_MS} - (30000 - g)::bigint * 1051200, 0, left(md5('user' || (g % 150)), 26),"
            " left(md5('channel' || (g % 40)), 26), '', 'message ' || g, '', '{{}}', '', '[]',"
            " g % 101 = 0 FROM generate_series(1, 30000) g",
            # each user's reactions: no foreign key, so they stay when their post goes
            "INSERT INTO reactions (userid, postid, emojiname, createat, updateat, deleteat)"
            " SELECT left(md5('user' || (g % 150)), 26), left(md5('post' || (g * 3)), 26),"
            " (ARRAY['+1', 'smile', 'tada'])[1 + g % 3], {T_MS}, {T_MS}, 0"
            " FROM generate_series(1, 10000) g",
        ),
        policies=(
            """
slug = "mattermost-posts"
name = "Messages older than 180 days, pinned kept"
table = "{schema}.posts"
key = "id"
timestamp = "createat"
timestamp_unit = "ms"
tenant = "channelid"
chunking = "timestamp"
retention = "180 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "ispinned"
op = "="
value = true
""",
        ),
        holds=(Hold("mattermost-posts", tenant="0a578e37c6b34f50e9341b88de"),),  # md5("channel3")[:26]
    ),
    Case(
        name="airflow", project="Apache Airflow", ddl="airflow.sql",
        fill=(
            # 30,000 log events over 180 days; 9% outside any DAG (dag_id NULL)
            "INSERT INTO log (dttm, dag_id, task_id, event, run_id, owner, extra, try_number)"
            " SELECT {T} - g * interval '517 seconds',"
            " CASE WHEN g % 11 = 0 THEN NULL"
            " ELSE (ARRAY['billing_close', 'etl_daily', 'ml_train', 'reports'])[1 + g % 4] END,"
            " CASE WHEN g % 11 = 0 THEN NULL ELSE 'task_' || (g % 7) END,"
            " (ARRAY['running', 'success', 'failed', 'cli_task_run', 'trigger'])[1 + g % 5],"
            " 'scheduled__' || (g / 100), 'airflow', NULL, 1 FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "airflow-log"
name = "Airflow event log older than 90 days"
table = "{schema}.log"
key = "id"
timestamp = "dttm"
tenant = "dag_id"
null_tenant = "delete"
retention = "90 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("airflow-log", tenant="billing_close"),),
    ),
    Case(
        name="discourse", project="Discourse", ddl="discourse.sql",
        fill=(
            # 500 users, each visiting every ninth day for two years (one row per user and day)
            "INSERT INTO user_visits (user_id, visited_at, posts_read)"
            " SELECT 1 + g % 500, ({T} AT TIME ZONE 'UTC')::date - (g / 500) * 9 - (g % 9), g % 40"
            " FROM generate_series(0, 39999) g",
        ),
        policies=(
            """
slug = "discourse-visits"
name = "Daily visits older than a year"
table = "{schema}.user_visits"
key = "id"
timestamp = "visited_at"
tenant = "user_id"
retention = "365 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("discourse-visits", tenant="42"),),
    ),
    Case(
        name="supabase", project="Supabase Realtime", ddl="supabase_realtime.sql",
        fill=(
            # a partition per day for the eight days before the tick (as realtime.send makes them)
            "DO $$ DECLARE d date; BEGIN"
            " FOR d IN SELECT generate_series(date '2026-11-22', date '2026-11-30', interval '1 day')::date"
            " LOOP EXECUTE format('CREATE TABLE %I PARTITION OF messages FOR VALUES FROM (%L) TO (%L)',"
            " 'messages_' || to_char(d, 'YYYY_MM_DD'), d, d + 1); END LOOP; END $$",
            # 30,000 broadcasts over the last seven days, UTC wall-clock time
            "INSERT INTO messages (topic, extension, payload, event, private, updated_at, inserted_at, id)"
            " SELECT (ARRAY['room:lobby', 'room:support', 'room:compliance', 'room:' || (g % 50)])[1 + g % 4],"
            " CASE WHEN g % 10 = 0 THEN 'presence' ELSE 'broadcast' END, '{{\"n\": 1}}', 'message', g % 3 = 0,"
            " ({T} AT TIME ZONE 'UTC') - g * interval '20 seconds',"
            " ({T} AT TIME ZONE 'UTC') - g * interval '20 seconds', md5('message' || g)::uuid"
            " FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "realtime-messages"
name = "Realtime messages older than 72 hours"
table = "{schema}.messages"
key = "id"
timestamp = "inserted_at"
timestamp_zone = "UTC"
retention = "72 hours"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "topic"
op = "="
value = "room:compliance"
""",
        ),
    ),
    Case(
        name="gitlab", project="GitLab", ddl="gitlab.sql", schemas=("dynamic",),
        fill=(
            # the partitions GitLab's partition manager keeps: one per month, in their own schema
            "DO $$ DECLARE m date; BEGIN"
            " EXECUTE format('CREATE TABLE %I.web_hook_logs_000000 PARTITION OF web_hook_logs"
            " FOR VALUES FROM (MINVALUE) TO (%L)', '{S}_dynamic', date '2026-05-01');"
            " FOR m IN SELECT generate_series(date '2026-05-01', date '2026-12-01', interval '1 month')::date"
            " LOOP EXECUTE format('CREATE TABLE %I.%I PARTITION OF web_hook_logs FOR VALUES FROM (%L) TO (%L)',"
            " '{S}_dynamic', 'web_hook_logs_' || to_char(m, 'YYYYMM'), m, (m + interval '1 month')::date);"
            " END LOOP; END $$",
            # 30,000 deliveries, one every 10 minutes for 208 days (ids follow time), UTC
            # wall-clock time; in June every 7th delivery is web hook 99's (under a hold)
            "INSERT INTO web_hook_logs (id, web_hook_id, trigger, url, request_headers, request_data,"
            " response_headers, response_body, response_status, execution_duration, updated_at, created_at)"
            " SELECT g, CASE WHEN at >= '2026-06-01' AND at < '2026-07-01' AND g % 7 = 0 THEN 99"
            " ELSE 1 + g % 40 END, (ARRAY['push_hooks', 'merge_request_hooks', 'pipeline_hooks'])[1 + g % 3],"
            " 'https://hooks.example.org/' || (g % 40), '{{}}', '{{\"object_kind\": \"push\"}}', '{{}}', 'ok',"
            " CASE WHEN g % 23 = 0 THEN '500' ELSE '200' END, 0.1 + (g % 50) / 100.0, at, at"
            " FROM (SELECT g, ({T} AT TIME ZONE 'UTC') - (30001 - g) * interval '10 minutes' AS at"
            " FROM generate_series(1, 30000) g) s",
        ),
        policies=(
            """
slug = "gitlab-web-hook-logs"
name = "Web hook logs older than 90 days"
table = "{schema}.web_hook_logs"
key = "id"
timestamp = "created_at"
timestamp_zone = "UTC"
tenant = "web_hook_id"
retention = "90 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("gitlab-web-hook-logs", tenant="99"),),
        # cutoff 2026-09-01 03:00: of the five partitions past it, 000000 (empty), 202605,
        # 202607 and 202608 go whole; 202606 holds web hook 99's rows and stays, deleted in
        # chunks (no action recorded for it); 202609 straddles the cutoff
        partitions=(("dropped", 4),),
    ),
    Case(
        name="keycloak", project="Keycloak", ddl="keycloak.sql",
        fill=(
            # 30,000 admin events over 360 days in five realms, milliseconds since the epoch
            "INSERT INTO admin_event_entity (id, admin_event_time, realm_id, operation_type,"
            " auth_realm_id, auth_client_id, auth_user_id, ip_address, resource_path, resource_type)"
            " SELECT md5('admin-event' || g)::uuid::text, {T_MS} - g::bigint * 1036800,"
            " md5('realm' || (g % 5))::uuid::text, (ARRAY['CREATE', 'UPDATE', 'DELETE', 'ACTION'])[1 + g % 4],"
            " md5('realm0')::uuid::text, md5('admin-cli')::uuid::text, md5('admin' || (g % 12))::uuid::text,"
            " '10.0.' || (g % 200) || '.7', 'users/' || md5('user' || (g % 3000))::uuid,"
            " (ARRAY['USER', 'CLIENT', 'REALM_ROLE', 'GROUP'])[1 + (g / 4) % 4]"
            " FROM generate_series(1, 30000) g",
            # 20,000 user events over 60 days in the same realms; every 9th a failed login
            "INSERT INTO event_entity (id, client_id, details_json, error, ip_address, realm_id,"
            " session_id, event_time, type, user_id)"
            " SELECT md5('event' || g)::uuid::text, 'account-console', '{{\"auth_method\": \"openid-connect\"}}',"
            " CASE WHEN g % 9 = 0 THEN 'invalid_user_credentials' END, '10.1.' || (g % 200) || '.9',"
            " md5('realm' || (g % 5))::uuid::text, md5('session' || (g / 3))::uuid::text,"
            " {T_MS} - g::bigint * 259200,"
            " CASE WHEN g % 9 = 0 THEN 'LOGIN_ERROR' ELSE (ARRAY['LOGIN', 'CODE_TO_TOKEN', 'REFRESH_TOKEN',"
            " 'LOGOUT'])[1 + g % 4] END, md5('user' || (g % 3000))::uuid::text"
            " FROM generate_series(1, 20000) g",
        ),
        policies=(
            """
slug = "keycloak-admin-events"
name = "Admin events older than 180 days, deletions kept"
table = "{schema}.admin_event_entity"
key = "id"
timestamp = "admin_event_time"
timestamp_unit = "ms"
tenant = "realm_id"
chunking = "key"
retention = "180 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "operation_type"
op = "="
value = "DELETE"
""",
            """
slug = "keycloak-events"
name = "User events older than 30 days, failed logins kept"
table = "{schema}.event_entity"
key = "id"
timestamp = "event_time"
timestamp_unit = "ms"
tenant = "realm_id"
chunking = "key"
retention = "30 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "type"
op = "="
value = "LOGIN_ERROR"
""",
        ),
        holds=(  # md5("realm3")
            Hold("keycloak-admin-events", tenant="060241cc-e47e-c57c-3278-d9f0e2acd6b8"),
            Hold("keycloak-events", tenant="060241cc-e47e-c57c-3278-d9f0e2acd6b8"),
        ),
    ),
    Case(
        name="home_assistant", project="Home Assistant", ddl="home_assistant.sql",
        fill=(
            "INSERT INTO states_meta (entity_id) SELECT 'sensor.s' || g FROM generate_series(1, 40) g",
            "INSERT INTO state_attributes (hash, shared_attrs)"
            " SELECT g, '{{}}' FROM generate_series(1, 40) g",
            # 60,000 state changes over 20 days (one per entity every ~11.5 minutes), each
            # referencing its entity's previous state; the recorder keeps 10 days
            "INSERT INTO states (state_id, state, last_updated_ts, last_changed_ts,"
            " old_state_id, attributes_id, metadata_id)"
            " OVERRIDING SYSTEM VALUE SELECT g, (g % 7)::text,"
            " {T_S} - (60000 - g) * 28.8 + (g % 1000) / 1000.0,"
            " {T_S} - (60000 - g) * 28.8 + (g % 1000) / 1000.0,"
            " CASE WHEN g > 40 THEN g - 40 END, 1 + g % 40, 1 + g % 40"
            " FROM generate_series(1, 60000) g",
            # the purge's own step, as the recorder does before it deletes: the oldest kept
            # state of each entity stops referencing the state before it
            "UPDATE states s SET old_state_id = NULL WHERE s.last_updated_ts >= {T_S} - 864000"
            " AND s.old_state_id IN (SELECT state_id FROM states"
            "  WHERE last_updated_ts < {T_S} - 864000)",
        ),
        policies=(
            """
slug = "ha-states"
name = "Recorder states older than 10 days"
table = "{schema}.states"
key = "state_id"
timestamp = "last_updated_ts"
timestamp_unit = "s"
retention = "10 days"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("ha-states", key_from=100, key_to=200),),
        kept_referenced=True,
    ),
    Case(
        name="wagtail", project="Wagtail", ddl="wagtail.sql",
        fill=(
            # 60,000 revisions of 1,500 pages over two years
            "INSERT INTO wagtailcore_revision (id, created_at, content, object_id, object_str,"
            " base_content_type_id, content_type_id, user_id) OVERRIDING SYSTEM VALUE"
            " SELECT g, {T} - (60000 - g) * interval '17 minutes', '{{}}', (g % 1500)::text,"
            " 'Page ' || g % 1500, 3, 3, 1 + g % 20 FROM generate_series(1, 60000) g",
            # each page's live revision is one of its old ones; its latest, its newest
            "INSERT INTO wagtailcore_page (id, title, live, live_revision_id, latest_revision_id)"
            " OVERRIDING SYSTEM VALUE SELECT p, 'Page ' || p, true,"
            " (SELECT min(id) FROM wagtailcore_revision WHERE object_id = p::text) + 1500 * (p % 3),"
            " (SELECT max(id) FROM wagtailcore_revision WHERE object_id = p::text)"
            " FROM generate_series(0, 1499) p",
            # workflow task states of 400 old revisions
            "INSERT INTO wagtailcore_taskstate (status, started_at, revision_id)"
            " SELECT 'approved', {T} - interval '400 days', 700 + g * 37 FROM generate_series(1, 400) g",
        ),
        policies=(
            """
slug = "wagtail-revisions"
name = "Revisions older than a year"
table = "{schema}.wagtailcore_revision"
key = "id"
timestamp = "created_at"
retention = "1 year"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("wagtail-revisions", key_from=5000, key_to=5100),),
        kept_referenced=True,
    ),
    Case(
        name="mastodon", project="Mastodon", ddl="mastodon.sql",
        fill=(
            "INSERT INTO accounts SELECT g, 'account' || g FROM generate_series(1, 200) g",
            # 30,000 statuses, one an hour for 3.4 years (ids follow time); every fifth is a
            # reblog of a status up to 500 days older, by another account
            "INSERT INTO statuses (id, text, created_at, updated_at, reblog_of_id, visibility,"
            " account_id, local)"
            " SELECT g, CASE WHEN g % 5 = 0 THEN '' ELSE 'toot ' || g END,"
            " ({T} AT TIME ZONE 'UTC') - (30000 - g) * interval '1 hour',"
            " ({T} AT TIME ZONE 'UTC') - (30000 - g) * interval '1 hour',"
            " CASE WHEN g % 5 = 0 AND g - 1 - (g * 7919) % 12000 > 0"
            " THEN g - 1 - (g * 7919) % 12000 END, 0, 1 + (g * 13) % 200, true"
            " FROM generate_series(1, 30000) g",
        ),
        policies=(
            """
slug = "mastodon-statuses"
name = "Statuses older than a year"
table = "{schema}.statuses"
key = "id"
timestamp = "created_at"
tenant = "account_id"
retention = "1 year"
chunk_size = 4000
schedule = "0 3 * * *"
timezone = "UTC"
cascade_ack = ["{schema}.statuses"]
""",
        ),
        holds=(Hold("mastodon-statuses", tenant="11"),),
    ),
    # Round three. n8n: quoted camelCase columns (the policy names "stoppedAt" as written), an
    # execution's data, metadata and annotation cascading, the annotation's tags a level below
    Case(
        name="n8n", project="n8n", ddl="n8n.sql",
        fill=(
            "INSERT INTO workflow_entity (id, name, active)"
            " SELECT 'wf' || g, 'Workflow ' || g, g % 4 <> 0 FROM generate_series(1, 30) g",
            "INSERT INTO annotation_tag_entity SELECT 'tag' || g, 'Tag ' || g"
            " FROM generate_series(1, 5) g",
            # 12,000 executions over 60 days; every 97th waits (no stoppedAt yet or a stale
            # one: kept by the policy), every 500th is still running (stoppedAt NULL)
            "INSERT INTO execution_entity (id, finished, mode, \"startedAt\", \"stoppedAt\","
            " \"waitTill\", status, \"workflowId\", \"createdAt\")"
            " SELECT g, g % 97 <> 0, 'trigger', {T} - (12000 - g) * interval '432 seconds',"
            " CASE WHEN g % 500 <> 0 THEN {T} - (12000 - g) * interval '432 seconds'"
            "  + interval '3 seconds' END,"
            " CASE WHEN g % 97 = 0 THEN {T} + interval '1 day' END,"
            " CASE WHEN g % 97 = 0 THEN 'waiting' WHEN g % 500 = 0 THEN 'running'"
            "  WHEN g % 13 = 0 THEN 'error' ELSE 'success' END,"
            " 'wf' || (1 + g % 30), {T} - (12000 - g) * interval '432 seconds'"
            " FROM generate_series(1, 12000) g",
            "INSERT INTO execution_data SELECT id, '{{}}', '[]' FROM execution_entity",
            "INSERT INTO execution_metadata (\"executionId\", key, value)"
            " SELECT id, 'customer', 'c' || id % 40 FROM execution_entity WHERE id % 3 = 0",
            "INSERT INTO execution_annotations (\"executionId\", vote, note)"
            " SELECT id, CASE WHEN id % 20 = 0 THEN 'up' ELSE 'down' END, 'checked'"
            " FROM execution_entity WHERE id % 10 = 0",
            "INSERT INTO execution_annotation_tags"
            " SELECT a.id, 'tag' || (1 + (a.id + k) % 5) FROM execution_annotations a,"
            " generate_series(0, 1) k",
        ),
        policies=(
            """
slug = "n8n-executions"
name = "Executions stopped more than 30 days ago (EXECUTIONS_DATA_MAX_AGE=720)"
table = "{schema}.execution_entity"
key = "id"
timestamp = "stoppedAt"
retention = "30 days"
chunk_size = 1500
schedule = "0 3 * * *"
timezone = "UTC"
cascade_ack = ["{schema}.execution_data", "{schema}.execution_metadata",
               "{schema}.execution_annotations", "{schema}.execution_annotation_tags"]

[[keep]]
column = "status"
op = "="
value = "waiting"
""",
        ),
        holds=(Hold("n8n-executions", key_from=2000, key_to=2100),),
    ),
    # Zabbix: history without a primary key (one index on (itemid, clock)), clock in epoch
    # seconds; the housekeeper's job, per item
    Case(
        name="zabbix", project="Zabbix", ddl="zabbix.sql",
        fill=(
            "INSERT INTO items (itemid, name) SELECT g, 'item ' || g FROM generate_series(1, 40) g",
            # 500 values per item over 180 days; two values share a second now and then (ns)
            "INSERT INTO history (itemid, clock, value, ns)"
            " SELECT 1 + g % 40, ({T_S} - (20000 - g) * 777)::integer, (g % 1000) / 7.0,"
            " (g * 7919) % 1000000000 FROM generate_series(1, 20000) g",
            "INSERT INTO history (itemid, clock, value, ns)"
            " SELECT itemid, clock, value + 1, ns + 1 FROM history WHERE clock % 50 = 0",
        ),
        policies=(
            """
slug = "zabbix-history"
name = "Numeric history older than 90 days (the housekeeper's default)"
table = "{schema}.history"
key = "clock"
tenant = "itemid"
timestamp = "clock"
timestamp_unit = "s"
retention = "90 days"
chunk_size = 2000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("zabbix-history", tenant="7"),),
    ),
    # Supabase Storage: row-level security on storage.objects and the statement-level BEFORE
    # DELETE trigger refusing direct deletes, which the operator lifts for the worker login
    # (ALTER ROLE … SET storage.can_delete = 'true'); without it every chunk fails on it
    Case(
        name="supabase_storage", project="Supabase Storage", ddl="supabase_storage.sql",
        fill=(
            "INSERT INTO buckets (id, name, public) VALUES ('avatars', 'avatars', true),"
            " ('exports', 'exports', false), ('uploads', 'uploads', false)",
            # 9,000 objects over 300 days
            "INSERT INTO objects (id, bucket_id, name, owner, created_at, updated_at,"
            " last_accessed_at, metadata)"
            " SELECT md5('object' || g)::uuid,"
            " (ARRAY['avatars', 'exports', 'uploads'])[1 + g % 3], 'folder' || g % 50 || '/f' || g,"
            " md5('owner' || g % 200)::uuid, {T} - (9000 - g) * interval '48 minutes',"
            " {T} - (9000 - g) * interval '48 minutes', {T} - (9000 - g) * interval '40 minutes',"
            " jsonb_build_object('size', g * 13, 'mimetype', 'application/pdf')"
            " FROM generate_series(1, 9000) g",
        ),
        policies=(
            """
slug = "storage-objects"
name = "Stored objects older than 90 days, avatars kept"
table = "{schema}.objects"
key = "id"
timestamp = "created_at"
retention = "90 days"
chunk_size = 1500
schedule = "0 3 * * *"
timezone = "UTC"

[[keep]]
column = "bucket_id"
op = "="
value = "avatars"
""",
        ),
        session=(("storage.can_delete", "true"),),
    ),
    # Sentry: the node store's random 32-character hex keys, whose order says nothing of age
    Case(
        name="sentry", project="Sentry", ddl="sentry.sql",
        fill=(
            "INSERT INTO nodestore_node (id, data, \"timestamp\")"
            " SELECT md5('node' || g), repeat('e', 200), {T} - (12000 - g) * interval '15 minutes'"
            " FROM generate_series(1, 12000) g",
        ),
        policies=(
            """
slug = "sentry-nodestore"
name = "Event payloads older than 90 days (SENTRY_EVENT_RETENTION_DAYS)"
table = "{schema}.nodestore_node"
key = "id"
timestamp = "timestamp"
retention = "90 days"
chunk_size = 2000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
    ),
    # NetBox: the change log, its deferred foreign keys to content types and users
    Case(
        name="netbox", project="NetBox", ddl="netbox.sql",
        fill=(
            "INSERT INTO django_content_type (app_label, model)"
            " SELECT 'dcim', 'model' || g FROM generate_series(1, 12) g",
            "INSERT INTO users_user (username) SELECT 'user' || g FROM generate_series(1, 20) g",
            # 15,000 changes over two years, in requests of five
            "INSERT INTO core_objectchange (id, \"time\", user_name, request_id, action,"
            " changed_object_id, object_repr, postchange_data, changed_object_type_id, user_id)"
            " OVERRIDING SYSTEM VALUE SELECT g, {T} - (15000 - g) * interval '70 minutes',"
            " 'user' || (1 + g % 20), md5('request' || g / 5)::uuid,"
            " (ARRAY['create', 'update', 'delete'])[1 + g % 3], g % 3000, 'device ' || g % 3000,"
            " jsonb_build_object('name', 'device ' || g % 3000), 1 + g % 12, 1 + g % 20"
            " FROM generate_series(1, 15000) g",
        ),
        policies=(
            """
slug = "netbox-changelog"
name = "Change records older than 90 days (CHANGELOG_RETENTION)"
table = "{schema}.core_objectchange"
key = "id"
timestamp = "time"
retention = "90 days"
chunk_size = 2000
schedule = "0 3 * * *"
timezone = "UTC"
""",
        ),
        holds=(Hold("netbox-changelog", key_from=100, key_to=200),),
    ),
    # A CRM's messages: four children cascade from a message, and a reply references the
    # message it answers with ON DELETE SET NULL — a young reply to an old message loses its
    # reference, and only such replies change
    Case(
        name="crm", project="Chatwoot", ddl="chatwoot.sql",
        fill=(
            # 10,000 messages over 400 days (naive timestamps, UTC), every fourth replying
            # to the message two before it
            "INSERT INTO messages (id, content, account_id, inbox_id, conversation_id,"
            " message_type, created_at, updated_at, in_reply_to)"
            " SELECT g, 'message ' || g, 1 + g % 6, 1 + g % 12, g / 8, g % 2,"
            " ({T} AT TIME ZONE 'UTC') - (10000 - g) * interval '3456 seconds',"
            " ({T} AT TIME ZONE 'UTC') - (10000 - g) * interval '3456 seconds',"
            " CASE WHEN g % 4 = 0 THEN g - 2 END FROM generate_series(1, 10000) g",
            "INSERT INTO attachments (message_id, account_id, created_at, updated_at)"
            " SELECT id, account_id, created_at, updated_at FROM messages WHERE id % 5 = 0",
            "INSERT INTO csat_survey_responses (account_id, conversation_id, message_id, rating,"
            " contact_id, created_at, updated_at)"
            " SELECT account_id, conversation_id, id, 1 + id % 5, id % 300, created_at, updated_at"
            " FROM messages WHERE id % 50 = 0",
            "INSERT INTO message_reads SELECT m.id, u, m.created_at FROM messages m,"
            " generate_series(1, 2) u WHERE m.id % 2 = 0",
            "INSERT INTO message_reactions (message_id, user_id, emoji)"
            " SELECT id, id % 30, 'thumbs_up' FROM messages WHERE id % 7 = 0",
        ),
        policies=(
            """
slug = "crm-messages"
name = "Messages older than a year"
table = "{schema}.messages"
key = "id"
timestamp = "created_at"
tenant = "account_id"
retention = "365 days"
chunk_size = 1500
schedule = "0 3 * * *"
timezone = "UTC"
cascade_ack = ["{schema}.attachments", "{schema}.csat_survey_responses",
               "{schema}.message_reads", "{schema}.message_reactions"]
""",
        ),
        holds=(Hold("crm-messages", tenant="3"),),
        # the replies that stay whose message went lose their reference (ON DELETE SET NULL),
        # held and young ones too: the rule applied to the shadow, every other row unchanged
        changes=(
            "UPDATE {SH}.messages r SET in_reply_to = NULL WHERE r.in_reply_to IS NOT NULL"
            " AND EXISTS (SELECT 1 FROM {S}.messages l WHERE l.id = r.id)"
            " AND NOT EXISTS (SELECT 1 FROM {S}.messages p WHERE p.id = r.in_reply_to)",
        ),
    ),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_a_real_schema_drains_exactly_what_its_policy_allows(db, settings, case):
    settings.RETENTION = {**settings.RETENTION, "GUARD": False}
    outcome = run_case(case)
    deleted = sum(outcome.audited.values())
    print(
        f"\n{case.project}: {sum(outcome.rows.values())} rows in {len(outcome.rows)} table(s),"
        f" {deleted} deleted in {outcome.chunks} chunk(s), {outcome.seconds:.1f} s;"
        f" gone per table {outcome.gone}"
    )
    for run in outcome.runs:
        print(f"  {run.policy.slug}: {run.chunking} chunks; verification {run.verification}")
    if outcome.partitions:
        print(f"  partitions taken whole or left: {outcome.partitions}")
    for problem in outcome.problems:
        print(f"  problem: {problem}")
    assert outcome.problems == []
    if case.partitions:  # the harness judges rows; this says which partitions went whole
        assert outcome.partitions == dict(case.partitions)
    assert deleted > 0  # every case has old rows: a case that deletes nothing proves nothing
    if case.holds:  # each case's holds protect old rows that would otherwise go
        assert sum(r.verification.get("deferred_by_holds", 0) for r in outcome.runs) > 0
    # a case's SET NULL rule did change rows that stay (the scenario happened)
    assert all(n > 0 for n in outcome.changed), outcome.changed
    # a row kept because a row that stays references it (another table's deferred key,
    # Wagtail's pages and task states; the table's own key, Home Assistant's old_state_id) is
    # left in place by its chunk's DELETE: no chunk failed on an integrity error and was split
    # towards single rows, and no dead letter was written
    failed = Chunk.objects.filter(run__in=outcome.runs, last_sqlstate__startswith="23")
    assert list(failed.values_list("last_sqlstate", "last_error")) == []
    assert not DeadLetter.objects.filter(run__in=outcome.runs).exists()
    if case.kept_referenced:  # such rows were among the old ones (the scenario happened)
        assert all(r.verification.get("kept_referenced", 0) > 0 for r in outcome.runs)


def test_the_corpus_names_at_least_eight_projects_each_with_its_source():
    from tests.realschemas.corpus import DDL

    assert len({c.project for c in CASES}) >= 8
    for case in CASES:
        head = (DDL / case.ddl).read_text()[:2000]
        assert "Repository: https://github.com/" in head, case.ddl
        assert "Commit: " in head or "(commit " in head, case.ddl


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def test_the_crm_policy_without_cascade_ack_names_its_four_child_tables_at_once(db):
    """The report's CRM: a policy written without ``cascade_ack`` is refused with one line that
    names every table a message's deletion reaches, not one table per attempt."""
    from retention import actions as retention_actions
    from retention.spec import SpecError, load_toml
    from tests.realschemas.corpus import load
    from tests.runs.shapes import fast_user

    case = _case("crm")
    load(case)
    text = case.policies[0].replace("{schema}", case.schema)
    text = text[: text.index("cascade_ack")]
    with pytest.raises(SpecError) as refused:
        retention_actions.apply_spec(load_toml(text), author=fast_user("crm-author", "compliance"))
    message = str(refused.value)
    assert "\n" not in message
    assert "deletes rows of 4 table(s) not listed in cascade_ack" in message
    for child in ("attachments", "csat_survey_responses", "message_reads", "message_reactions"):
        assert f"'{case.schema}.{child}'" in message


def test_a_key_interval_hold_on_the_node_stores_random_text_keys_is_refused(db):
    """Sentry's node store has random hex text keys: a key interval such as ``--key-from 0
    --key-to 1`` has no place in their order and is refused with one line, nothing placed —
    not shown as "every row, keys [0, 1)" and silently holding the whole table."""
    import tomllib

    from retention import actions as retention_actions
    from retention.models import LegalHold
    from tests.factories import approved_policy
    from tests.realschemas.corpus import load
    from tests.runs.shapes import fast_user

    case = _case("sentry")
    load(case)
    policy = approved_policy(
        fast_user, **tomllib.loads(case.policies[0].replace("{schema}", case.schema))
    )
    with pytest.raises(retention_actions.ActionError) as refused:
        retention_actions.place_hold(
            actor=fast_user("sentry-keeper", "compliance"), reason="case 40", policy=policy,
            key_from=0, key_to=1,
        )  # fmt: skip
    assert str(refused.value) == (
        "policy sentry-nodestore's key (id character varying(40)) is not one integer column: a "
        "key interval has no place in its order (it would hold every row); hold the whole "
        "policy or a tenant instead"
    )
    assert not LegalHold.objects.exists()
