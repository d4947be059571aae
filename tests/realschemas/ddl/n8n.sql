-- n8n: workflow executions (execution_entity), their data, metadata and annotations; an
-- annotation's tags cascade from the annotation, so deleting an execution cascades two levels
-- Repository: https://github.com/n8n-io/n8n
-- Path: packages/cli/src/databases/migrations/postgresdb/ (1587669153312-InitialMigration.ts,
--       1594828256133-CreateIndexStoppedAt.ts, 1679416281778-CreateExecutionMetadataTable.ts,
--       1690000000020-SeparateExecutionData.ts, 1693554410387-DisallowOrphanExecutions.ts,
--       1694091729095-MigrateToTimestampTz.ts; execution_annotations / execution_annotation_tags
--       as the entities ExecutionAnnotation and AnnotationTagMapping declare them)
-- Commit: 5eaf984153d9ea509eee2a006da37cc29dffea77 (SeparateExecutionData)
-- Licence: Sustainable Use License (n8n's fair-code licence). The column names, quoted
-- camelCase as TypeORM creates them, and the keys are the project's; the table set is cut down
-- to what an execution's deletion reaches (users, projects and credentials left out).
CREATE TABLE workflow_entity (
    id character varying(36) PRIMARY KEY,
    name character varying(128) NOT NULL,
    active boolean NOT NULL,
    "createdAt" timestamp(3) with time zone NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    "updatedAt" timestamp(3) with time zone NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
);

CREATE TABLE execution_entity (
    id SERIAL PRIMARY KEY,
    finished boolean NOT NULL,
    mode character varying NOT NULL,
    "retryOf" character varying,
    "retrySuccessId" character varying,
    "startedAt" timestamp(3) with time zone,
    "stoppedAt" timestamp(3) with time zone,
    "waitTill" timestamp(3) with time zone,
    status character varying NOT NULL,
    "workflowId" character varying(36) NOT NULL,
    "deletedAt" timestamp(3) with time zone,
    "createdAt" timestamp(3) with time zone NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    CONSTRAINT "FK_execution_entity_workflowId" FOREIGN KEY ("workflowId")
        REFERENCES workflow_entity (id) ON DELETE CASCADE
);
CREATE INDEX "IDX_execution_entity_stoppedAt" ON execution_entity ("stoppedAt");
CREATE INDEX "IDX_execution_entity_workflowId_id" ON execution_entity ("workflowId", id);

CREATE TABLE execution_data (
    "executionId" integer NOT NULL PRIMARY KEY,
    "workflowData" json NOT NULL,
    data text NOT NULL,
    CONSTRAINT execution_data_fk FOREIGN KEY ("executionId")
        REFERENCES execution_entity (id) ON DELETE CASCADE
);

CREATE TABLE execution_metadata (
    id SERIAL PRIMARY KEY,
    "executionId" integer NOT NULL,
    key character varying(255) NOT NULL,
    value text NOT NULL,
    CONSTRAINT "FK_execution_metadata" FOREIGN KEY ("executionId")
        REFERENCES execution_entity (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX "IDX_cec8eea3bf49551482ccb4933e" ON execution_metadata ("executionId", key);

CREATE TABLE annotation_tag_entity (
    id character varying(16) PRIMARY KEY,
    name character varying(24) NOT NULL
);

CREATE TABLE execution_annotations (
    id SERIAL PRIMARY KEY,
    "executionId" integer NOT NULL,
    vote character varying(6),
    note text,
    "createdAt" timestamp(3) with time zone NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    "updatedAt" timestamp(3) with time zone NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    CONSTRAINT "FK_97f863fa83c4786f19565084960" FOREIGN KEY ("executionId")
        REFERENCES execution_entity (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX "IDX_97f863fa83c4786f1956508496" ON execution_annotations ("executionId");

CREATE TABLE execution_annotation_tags (
    "annotationId" integer NOT NULL,
    "tagId" character varying(24) NOT NULL,
    PRIMARY KEY ("annotationId", "tagId"),
    CONSTRAINT "FK_c1519757391996eb06064f0e7c8" FOREIGN KEY ("annotationId")
        REFERENCES execution_annotations (id) ON DELETE CASCADE,
    CONSTRAINT "FK_a3697779b366e131b2bbdae2976" FOREIGN KEY ("tagId")
        REFERENCES annotation_tag_entity (id) ON DELETE CASCADE
);
CREATE INDEX "IDX_a3697779b366e131b2bbdae297" ON execution_annotation_tags ("tagId");
