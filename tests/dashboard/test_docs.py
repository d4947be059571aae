"""Each page links the part of the docs that explains it; the docs are served read-only."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

DOCS_LINK = re.compile(r'<a class="docs-link"[^>]* href="(/docs/[^"]+)"')


def pages(run):
    version = run.policy_version
    return [
        reverse("home"),
        reverse("runs:list"),
        reverse("runs:detail", args=[run.pk]),
        reverse("runs:dead_letters"),
        reverse("runs:activity"),
        reverse("runs:audit"),
        reverse("retention:policy_list"),
        reverse("retention:policy_detail", args=[run.policy.slug]),
        reverse("retention:version_detail", args=[run.policy.slug, version.number]),
        reverse("retention:approvals"),
        reverse("retention:holds"),
        reverse("tokens"),
    ]


def test_every_page_links_its_docs_section_and_the_link_resolves(client_for, run):
    client = client_for("auditor")
    for url in pages(run):
        html = client.get(url).content.decode()
        found = DOCS_LINK.search(html)
        assert found, f"{url}: no docs link"
        target, _, anchor = found.group(1).partition("#")
        doc = client.get(target)
        assert doc.status_code == 200, (url, target)
        assert not anchor or f'id="{anchor}"' in doc.content.decode(), (url, found.group(1))


def test_a_doc_is_served_read_only_and_escaped(client_for):
    response = client_for("viewer").get(reverse("doc", args=["runbook"]))

    html = response.content.decode()
    assert response.status_code == 200
    assert '<h2 id="audit">Audit — <code>/runs/audit/</code> (auditor, compliance)</h2>' in html
    assert "Every operator action, newest first" in html
    assert "<script" not in html.split("<main>")[1]


@pytest.mark.parametrize("name", ["nope", "..", "least-privilege", "RUNBOOK"])
def test_only_the_docs_markdown_files_are_served(client_for, name):
    assert client_for("viewer").get(f"/docs/{name}/").status_code == 404


def test_docs_need_a_signed_in_user(client_for):
    response = client_for(None).get(reverse("doc", args=["runbook"]))
    assert response.status_code == 302 and "/login/" in response["Location"]
