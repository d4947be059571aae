-- Supabase Storage: storage.objects (and buckets) with row-level security enabled and its
-- policies, and the statement-level BEFORE DELETE trigger that refuses direct deletes unless
-- storage.can_delete is set for the session
-- Repository: https://github.com/supabase/storage
-- Path: migrations/tenant/0002-storage-schema.sql (buckets, objects, RLS);
--       migrations/tenant/0050-prevent-direct-deletes.sql (storage.protect_delete)
-- Commit: 396bb16d3f6e881f5bdeefd79328c2412f92ecef (0050-prevent-direct-deletes.sql)
-- Licence: Apache-2.0. Written unqualified (the case's scratch schema stands for "storage");
-- the roles' grants and the search functions left out; one policy as a project would write it.
CREATE TABLE buckets (
    id text NOT NULL,
    name text NOT NULL,
    owner uuid,
    created_at timestamptz DEFAULT now(),
    updated_at timestamptz DEFAULT now(),
    public boolean DEFAULT false,
    PRIMARY KEY (id)
);
CREATE UNIQUE INDEX bname ON buckets USING BTREE (name);

CREATE TABLE objects (
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    bucket_id text,
    name text,
    owner uuid,
    created_at timestamptz DEFAULT now(),
    updated_at timestamptz DEFAULT now(),
    last_accessed_at timestamptz DEFAULT now(),
    metadata jsonb,
    CONSTRAINT "objects_bucketId_fkey" FOREIGN KEY (bucket_id) REFERENCES buckets (id),
    PRIMARY KEY (id)
);
CREATE UNIQUE INDEX bucketid_objname ON objects USING BTREE (bucket_id, name);
CREATE INDEX name_prefix_search ON objects (name text_pattern_ops);
CREATE INDEX objects_created_at ON objects (created_at);

ALTER TABLE objects ENABLE ROW LEVEL SECURITY;
CREATE POLICY "owners read their objects" ON objects FOR SELECT
    USING (owner = nullif(current_setting('request.jwt.claim.sub', true), '')::uuid);
CREATE POLICY "owners delete their objects" ON objects FOR DELETE
    USING (owner = nullif(current_setting('request.jwt.claim.sub', true), '')::uuid);

CREATE FUNCTION protect_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF COALESCE(current_setting('storage.can_delete', true), 'false') != 'true' THEN
        RAISE EXCEPTION 'Direct deletion from storage tables is not allowed. Use the Storage API instead.'
            USING HINT = 'This prevents accidental data loss from orphaned objects.',
                  ERRCODE = '42501';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER protect_objects_delete BEFORE DELETE ON objects
    FOR EACH STATEMENT EXECUTE FUNCTION protect_delete();
