"""Webhook building blocks: the SSRF guard, the retry schedule, signing."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from inferq.domain.webhooks import (
    UnsafeWebhookUrl,
    WebhookEndpoint,
    check_webhook_url,
    new_secret,
    next_delay_s,
    parse_networks,
    retry_after_s,
    sign,
)

PUBLIC = "93.184.216.34"


def resolves_to(*addresses: str):  # type: ignore[no-untyped-def]
    return lambda _host, _port: list(addresses)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),  # noqa: S104
        ("10.1.2.3", "private"),
        ("172.16.0.5", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fd12:3456::1", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),
        ("::ffff:127.0.0.1", "IPv4-embedding IPv6 (loopback)"),
        ("::ffff:10.0.0.1", "IPv4-embedding IPv6 (private)"),
        ("2002:7f00:1::", "IPv4-embedding IPv6 (loopback)"),
    ],
)
def test_non_public_addresses_are_refused_with_the_reason(address: str, reason: str) -> None:
    with pytest.raises(UnsafeWebhookUrl) as refused:
        check_webhook_url("https://hooks.example.com/x", resolver=resolves_to(address))
    expected = f"resolves to {ipaddress.ip_address(address)}, a {reason} address"
    assert expected in refused.value.message
    assert refused.value.param == "webhook_url"


@pytest.mark.parametrize(
    "url", ["http://2130706433/", "http://0177.0.0.1/", "http://0x7f.0.0.1/", "http://127.1/"]
)
def test_numeric_spellings_of_loopback_are_resolved_and_refused(url: str) -> None:
    with pytest.raises(UnsafeWebhookUrl, match=r"127\.0\.0\.1, a loopback address"):
        check_webhook_url(url)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://hooks.example.com/x", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("gopher://hooks.example.com/", "only http and https"),
        ("http:///path-only", "it has no host"),
        ("http://hooks.example.com:99999/", "not a valid URL"),
    ],
)
def test_other_schemes_and_malformed_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(UnsafeWebhookUrl, match=why):
        check_webhook_url(url, resolver=resolves_to(PUBLIC))


def test_a_host_with_any_private_address_is_refused() -> None:
    with pytest.raises(UnsafeWebhookUrl, match=r"10\.0\.0\.7"):
        check_webhook_url("https://hooks.example.com/", resolver=resolves_to(PUBLIC, "10.0.0.7"))


def test_an_unresolvable_host_is_refused() -> None:
    def fail(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(UnsafeWebhookUrl, match="does not resolve"):
        check_webhook_url("https://nowhere.invalid/", resolver=fail)


def test_the_allow_list_admits_private_networks_it_names() -> None:
    allowed = parse_networks(["127.0.0.0/8", "10.0.0.0/8"])
    target = check_webhook_url("http://127.0.0.1:9000/hook", allowed=allowed)
    assert str(target.address) == "127.0.0.1"
    with pytest.raises(UnsafeWebhookUrl):
        check_webhook_url("http://192.168.0.1/", allowed=allowed)


def test_the_connection_goes_to_the_checked_address() -> None:
    target = check_webhook_url(
        "https://hooks.example.com:8443/in?a=1", resolver=resolves_to(PUBLIC)
    )
    assert target.pinned_url() == f"https://{PUBLIC}:8443/in?a=1"
    assert target.host_header() == "hooks.example.com:8443"
    assert target.host == "hooks.example.com"
    v6 = check_webhook_url("http://v6.example.com/", resolver=resolves_to("2606:4700::1111"))
    assert v6.pinned_url() == "http://[2606:4700::1111]/"


def test_retries_follow_the_schedule_with_jitter_then_stop() -> None:
    schedule = [0, 5, 300]
    assert next_delay_s(0, schedule, rand=lambda: 0.5) == 0
    assert next_delay_s(1, schedule, rand=lambda: 0.0) == pytest.approx(4.5)
    assert next_delay_s(1, schedule, rand=lambda: 1.0) == pytest.approx(5.5)
    assert next_delay_s(2, schedule, rand=lambda: 0.5) == pytest.approx(300)
    assert next_delay_s(3, schedule) is None
    assert next_delay_s(1, schedule, retry_after_s=120, rand=lambda: 0.5) == 120


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    now = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    assert retry_after_s("30", now) == 30
    assert retry_after_s("Sat, 21 Nov 2026 12:02:00 GMT", now) == 120
    assert retry_after_s("soon", now) is None
    assert retry_after_s(None, now) is None


def _endpoint(secret: str, previous: str | None, until: datetime | None) -> WebhookEndpoint:
    return WebhookEndpoint(
        id="whe_1",
        tenant="t",
        url="https://x.example/",
        secret=secret,
        previous_secret=previous,
        previous_expires_at=until,
        created_at=datetime.now(UTC),
        disabled_at=None,
        disabled_reason=None,
    )


def test_during_a_rotation_both_secrets_sign_and_either_verifies() -> None:
    old, new = new_secret(), new_secret()
    assert new.startswith("whsec_")
    now = datetime.now(UTC)
    endpoint = _endpoint(new, old, now + timedelta(hours=1))
    body = '{"type":"job.succeeded"}'
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": sign(
            endpoint.signing_secrets(now), msg_id="msg_1", timestamp=now, body=body
        ),
    }
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == {"type": "job.succeeded"}
    later = now + timedelta(hours=2)
    assert endpoint.signing_secrets(later) == [new]
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body.replace("succeeded", "failed"), headers)
