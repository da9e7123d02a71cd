"""The /duels page in a real browser: Debian's headless Chromium over the DevTools protocol
loads a duel, a person picks with the keyboard, the pick is in the ledger; a second rater sees
their own queue; a stranger without the token gets 401."""

import base64

import pytest

from pipecat_rl.duels.make import find_moments, make_duels
from pipecat_rl.ledger import Ledger
from pipecat_rl.service.settings import ServiceSettings
from tests.cdp import Browser
from tests.chromium import CHROMIUM
from tests.service_helpers import ServiceThread
from tests.test_duels import LengthSampler, call

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")

TOKEN = "browser-token"


def basic(rater: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{rater}:{TOKEN}".encode()).decode()}


def test_a_person_picks_with_the_keyboard_and_raters_keep_their_own_queues(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        call(store, "c1", turns=3)
        made = make_duels(store, find_moments(store, ["c1"]), ("short", "long"), LengthSampler(),
                          n=3)  # fmt: skip
    settings = ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN)
    with Browser(tmp_path / "profile") as browser, ServiceThread(settings) as service:
        alice = browser.tab(basic("alice"))
        assert alice.goto(f"{service.url}/duels") == 200
        first = alice.text()
        assert "3 duel(s) left in your queue" in first and "caller line" in first
        assert alice.press("1") == 200  # the left reply, by key: the form posts, then next
        assert "2 duel(s) left in your queue" in alice.text()
        assert alice.press("=") == 200
        with Ledger(tmp_path / "ledger.db", read_only=True) as ledger:
            votes = ledger.votes()
        assert [(v.rater, v.duel_id) for v in votes] == [("alice", made[0].id),
                                                          ("alice", made[1].id)]
        assert votes[0].choice == made[0].left_for("alice") == votes[0].shown_left
        assert votes[1].choice == "tie"
        bob = browser.tab(basic("bob"))
        assert bob.goto(f"{service.url}/duels") == 200
        assert "rater bob" in bob.text() and "3 duel(s) left in your queue" in bob.text()
        stranger = browser.tab()
        assert stranger.goto(f"{service.url}/duels") == 401
