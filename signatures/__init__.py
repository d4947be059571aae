"""Signed decisions: proof, made by the process that checked a person's password or token,
that the person decided — proof no database login can make.

The web process (and ``manage.py retention …`` run beside it) holds an Ed25519 private key
(``RETENTION_SIGNING_KEY``) that no database login and no worker host holds; every other
process holds only the public half (``RETENTION_VERIFY_KEY``). A decision the four-eyes
promise rests on — a version's submission, approval or rejection, a hold's release request and
release, and every operator-log row a person's action writes (roles, people, tokens) — is
signed over its canonical content and the deciding person's sealed identity
(``proof.sign``), and stored in ``models.Signature``. The workers, the scheduler and the
partition path act only on decisions that verify (``retention.decisions``); ``retention audit
verify`` names every decision that does not (docs/security.md, "Signed decisions").

This room imports nothing of the product's apps: ``core`` and everything above sign and
verify through it.
"""
