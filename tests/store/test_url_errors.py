"""A store URL that cannot be one is a StoreError that names what is wrong, the same from
``Store``, ``get_tuned_attention`` and the CLI (one line, exit 1); a password never shows."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from flashtune.cli import cli
from flashtune.store import Store, StoreError

BAD = [
    # before: ValueError "invalid literal for int() with base 10: 'notaport'"
    ("postgresql+psycopg://postgres@127.0.0.1:notaport/test",
     "port: expected a number from 1 to 65535 in the database URL "
     "'postgresql+psycopg://postgres@127.0.0.1:notaport/test', got 'notaport'"),
    ("postgresql://me:secret@db.example:99999/tuned",
     "port: expected a number from 1 to 65535 in the database URL 'postgresql://me:***@db.example:99999/tuned', "
     "got '99999'"),
    ("postgresql://me:secret@[::1]:x1/tuned",
     "port: expected a number from 1 to 65535 in the database URL 'postgresql://me:***@[::1]:x1/tuned', got 'x1'"),
    (123, "not a database URL or a file path: 123 (int); give a file path or a URL such as sqlite:///PATH"),
]


@pytest.mark.parametrize("url, message", BAD, ids=["port-text", "port-range", "port-ipv6", "not-a-url"])
def test_a_bad_url_is_one_store_error_everywhere(url, message):
    with pytest.raises(StoreError) as opening:
        Store(url)
    assert str(opening.value) == message
    from flashtune import get_tuned_attention

    with pytest.raises(StoreError) as serving:
        get_tuned_attention(url, device="cpu")
    assert str(serving.value) == message
    if isinstance(url, str):
        done = CliRunner().invoke(cli, ["list", "--db", url], prog_name="flashtune")
        assert (done.exit_code, done.output) == (1, f"Error: {message}\n")
    assert "secret" not in message
