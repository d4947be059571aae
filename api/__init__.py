"""The HTTP API, ``/api/v1/`` (django-ninja): every operation of the command line and the
pages as typed JSON, acting through the same action functions (docs/api.md)."""
