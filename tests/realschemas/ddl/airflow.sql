-- Apache Airflow: log (the audit log of DAG and task events)
-- Repository: https://github.com/apache/airflow
-- Path: airflow-core/src/airflow/models/log.py (class Log)
-- Commit: 024658b80a49f9be541a631ee43237be85b7d748
-- SQLAlchemy's DDL for PostgreSQL: Integer primary key -> SERIAL, UtcDateTime ->
-- timestamp with time zone, StringID() -> varchar(250); Mapped[X] is NOT NULL, Mapped[X | None]
-- and nullable=True are NULL. dag_id is NULL for events outside any DAG (cli, ui).
CREATE TABLE log (
    id SERIAL NOT NULL,
    dttm TIMESTAMP WITH TIME ZONE NOT NULL,
    dag_id VARCHAR(250),
    task_id VARCHAR(250),
    map_index INTEGER,
    event VARCHAR(60) NOT NULL,
    logical_date TIMESTAMP WITH TIME ZONE,
    run_id VARCHAR(250),
    owner VARCHAR(500),
    owner_display_name VARCHAR(500),
    extra TEXT,
    try_number INTEGER,
    CONSTRAINT log_pkey PRIMARY KEY (id)
);
CREATE INDEX idx_log_dttm ON log (dttm);
CREATE INDEX idx_log_event ON log (event);
CREATE INDEX idx_log_task_instance ON log (dag_id, task_id, run_id, map_index, try_number);
