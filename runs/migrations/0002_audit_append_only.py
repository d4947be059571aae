from django.db import migrations

SQL = """
CREATE FUNCTION runs_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit records are append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER runs_auditrecord_append_only
    BEFORE UPDATE OR DELETE ON runs_auditrecord
    FOR EACH ROW EXECUTE FUNCTION runs_audit_append_only();
CREATE TRIGGER retention_operatoraction_append_only
    BEFORE UPDATE OR DELETE ON retention_operatoraction
    FOR EACH ROW EXECUTE FUNCTION runs_audit_append_only();
"""

REVERSE = """
DROP TRIGGER IF EXISTS retention_operatoraction_append_only ON retention_operatoraction;
DROP TRIGGER IF EXISTS runs_auditrecord_append_only ON runs_auditrecord;
DROP FUNCTION IF EXISTS runs_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial"), ("retention", "0001_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
