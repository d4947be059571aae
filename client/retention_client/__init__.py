"""The ``retention`` command line as a client of the Retention Runner API (``/api/v1/``).

With ``RETENTION_URL`` and ``RETENTION_TOKEN`` set, every sub-command of ``manage.py
retention`` that acts as a person or reads runs over HTTPS (plain HTTP to a loopback address
only) and prints what the server's command line prints: the server runs the same handler and
returns its output. It imports nothing but the standard library and never opens a database
connection; the commands that need the database say so."""
