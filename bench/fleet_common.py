"""What the fleet's benches share: a throwaway control database with the people a policy
needs, and the bench's own embedded server with a ledger template to clone targets from.
Imported by a bench after ``django.setup()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def control_and_server(*, keep: bool = False) -> Iterator[tuple[dict, object, str]]:
    """(people, server, ledger template): the control database (``TEST_DATABASE_NAME``,
    migrated) with two compliance officers, an on-call engineer and her API token; the
    embedded server ``bench``. The control database is dropped at the end unless ``keep``."""
    from django.contrib.auth.models import Group, User
    from django.db import connection, connections

    from core.tokens import create_token
    from tests.fleet import servers
    from tests.fleet.conftest import migrate_url

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    people = {}
    for name, role in (("author", "compliance"), ("approver", "compliance"),
                       ("olga", "oncall")):  # fmt: skip
        user = User.objects.create_user(name, password=f"{name}-bench-pw-1")
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        people[name] = user
    people["token"] = create_token(people["olga"], name="bench")[1]
    server = servers.embedded("bench")
    try:
        yield people, server, server.ledger_template(migrate_url)
    finally:
        if not keep:
            bench_name = connection.settings_dict["NAME"]
            connections.close_all()
            connection.settings_dict["NAME"] = old_name
            with connection.cursor() as cur:  # the drain threads' sessions may linger a moment
                cur.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
