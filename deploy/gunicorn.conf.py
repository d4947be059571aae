"""gunicorn settings for the web process: ``gunicorn -c deploy/gunicorn.conf.py``.

Each value can be set from the environment; see docs/deploy.md."""

import multiprocessing
import os

wsgi_app = "config.wsgi:application"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# Threads serve slow pages (CSV export streams, previews) without blocking a process.
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", min(4, multiprocessing.cpu_count() * 2)))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "10"))
keepalive = 5
max_requests = 2000  # recycle a process now and then
max_requests_jitter = 200
# Only the local reverse proxy may set X-Forwarded-* (see SECURE_PROXY_SSL_HEADER).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
