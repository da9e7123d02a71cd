from pipecat_rl.recording import Redactor


def test_redacts_each_kind_of_pii():
    r = Redactor(names=["Maria Lopez", "Bob"])
    text = (
        "Maria Lopez here, card 4111 1111 1111 1111, phone +1 (415) 555-0134, "
        "mail maria.lopez@example.org; bob says hi. Order 12345 at 9:30."
    )
    out = r.text(text)
    for secret in ("Maria Lopez", "4111", "555-0134", "maria.lopez@", "bob"):
        assert secret not in out
    assert out.count("[NAME]") == 2 and "[CARD]" in out and "[PHONE]" in out and "[EMAIL]" in out
    assert "12345" in out and "9:30" in out  # short numbers and times are not PII


def test_card_numbers_need_a_valid_luhn_checksum():
    assert "[CARD]" not in Redactor().text("ref 4111 1111 1111 1112")
    assert "[CARD]" in Redactor().text("4111-1111-1111-1111")


def test_redacts_inside_nested_requests():
    request = {"messages": [{"role": "user", "content": "I'm Ann, ann@x.io"}], "n": 1}
    assert Redactor(names=["Ann"]).value(request) == {
        "messages": [{"role": "user", "content": "I'm [NAME], [EMAIL]"}],
        "n": 1,
    }
