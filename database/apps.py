from django.apps import AppConfig


class DatabaseConfig(AppConfig):
    name = "database"
    verbose_name = "Database logins, grants and functions"
