"""Archive, then delete: each chunk's rows are copied to a verified Parquet object before its
DELETE commits, listed in its audit record, and can be restored within the policy's window.

Layer: above ``retention`` (it reads the one predicate), below ``runs`` (the worker calls
``archive.step.archive_chunk`` inside its chunk transaction); it never imports ``runs``.
"""
