"""A policy directory synced with what the browser approved: ``retention policy pull DIR``
writes each approved version, then ``retention policy plan DIR`` reports no change; a typo
in a policy file is reported with its file, line and a suggestion."""

from __future__ import annotations

import io
import shutil

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from demo.policy_files import POLICY_DIR, apply_demo_policies
from demo.users import ensure_demo_users


def retention(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("retention", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def demo_approved(marketplace):
    ensure_demo_users()
    alice, carol = User.objects.get(username="alice"), User.objects.get(username="carol")
    apply_demo_policies(author=alice, approver=carol)


def test_pull_then_plan_reports_no_change_on_the_demo(demo_approved, tmp_path):
    code, out = retention("policy", "pull", str(tmp_path))
    assert code == 0
    assert sorted(p.name for p in tmp_path.glob("*.toml")) == sorted(
        p.name for p in POLICY_DIR.glob("*.toml")
    )
    assert out.count(": written (") == 4
    code, out = retention("policy", "plan", str(tmp_path))
    assert code == 0, out
    assert out.strip().endswith("plan: 0 change(s), 4 unchanged")
    code, again = retention("policy", "pull", str(tmp_path))
    assert again.count(": already up to date (") == 4
    code, shown = retention("policy", "show", "orders", "--toml")
    assert shown == (tmp_path / "orders.toml").read_text()


def test_a_typo_in_a_policy_file_names_the_file_the_line_and_the_key_meant(demo_approved, tmp_path):
    for path in POLICY_DIR.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    orders = tmp_path / "orders.toml"
    lines = orders.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.startswith("chunk_size"))
    orders.write_text("\n".join(lines).replace("chunk_size", "chunk_sise") + "\n")
    code, out = retention("policy", "plan", str(tmp_path))
    assert code == 1
    assert (
        f"orders.toml:{number}: error: unknown key in the policy: chunk_sise "
        "(did you mean 'chunk_size'?)"
    ) in out
