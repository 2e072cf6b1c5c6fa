"""outbound.post: one POST to another server within its deadline, whatever holds it up."""

from __future__ import annotations

import socket
import threading

import pytest
from receiver import receiving

from momentry_edge import outbound

SLOW_NAME = "slow-lookup.test"


def test_a_host_name_slower_to_look_up_than_the_deadline_is_too_slow_and_never_posted(
    monkeypatch,
):
    # The system resolver, for this one name, answers only when the test lets it (as one
    # whose name server does not answer, retried, can take far longer than any deadline).
    answer = threading.Event()
    answered = threading.Event()
    getaddrinfo = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host != SLOW_NAME:
            return getaddrinfo(host, *args, **kwargs)
        answer.wait(60)
        try:
            return getaddrinfo("127.0.0.1", *args, **kwargs)
        finally:
            answered.set()

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    with receiving() as rx, outbound.client(timeout=5) as http:
        url = rx.url.replace("127.0.0.1", SLOW_NAME) + "/hook"

        with pytest.raises(outbound.TooSlow, match=r"within 0\.5 s"):
            outbound.post(http, url, 0.5, json={"task_id": "task_1"})

        assert not answered.is_set()  # the caller did not wait for the lookup
        answer.set()
        assert answered.wait(10)
        for thread in threading.enumerate():
            if thread.name == "outbound-post":
                thread.join(10)
        assert rx.posts == []  # the late answer connected to no one

        # The same server by a name that looks up at once.
        assert outbound.post(http, rx.url + "/hook", 5, json={"task_id": "task_2"}) == 200
        assert [p.json() for p in rx.posts] == [{"task_id": "task_2"}]


def test_a_post_refused_by_where_it_connected_sends_nothing():
    with receiving() as rx, outbound.client(timeout=5) as http:
        port = int(rx.url.rsplit(":", 1)[1])
        url = rx.url.replace("127.0.0.1", "localhost") + "/hook"  # a name, not the address

        def refuse(address: str, at: int) -> str | None:
            return f"{address} port {at} is not to be posted to" if at == port else None

        with pytest.raises(outbound.Refused, match=f"127.0.0.1 port {port} is not to be posted"):
            outbound.post(http, url, 5, refuse, json={"task_id": "task_1"})
        assert rx.posts == []
        assert outbound.post(http, url, 5, lambda *_: None, json={"task_id": "task_2"}) == 200
        assert [p.json() for p in rx.posts] == [{"task_id": "task_2"}]


@pytest.mark.parametrize(
    ("host", "own"),
    [
        ("127.1", True),
        ("2130706433", True),
        ("::ffff:127.0.0.1", True),
        ("[::1]", True),
        ("0.0.0.0", True),
        ("192.0.2.1", False),  # TEST-NET: no machine's own
        ("example.test", False),  # a name is not looked up
    ],
)
def test_own_address_knows_this_machine_in_any_spelling(host, own):
    assert outbound.own_address(host) is own
