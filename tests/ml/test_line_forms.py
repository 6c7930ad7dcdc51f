"""The form of an unknown line: variable parts masked, so one message on many nodes is one form."""

from __future__ import annotations

from ml.line_forms import BUDGET, EXAMPLE_CHARS, FORM_CHARS, Forms, clip, form_id, form_of


def test_lines_differing_in_numbers_hosts_and_addresses_share_a_form() -> None:
    a = form_of("[rank3]: FooComm error: shard 17 of 64 stalled on gpu-node-017 after 5 retries", host="gpu-node-017")
    b = form_of("[rank12]: FooComm error: shard 3 of 64 stalled on gpu-node-031 after 12 retries", host="gpu-node-031")
    assert a == b
    assert a.form == "[rank<rank>]: FooComm error: shard <num> of <num> stalled on <host> after <num> retries"
    assert len(a.form_id) == 16 and a.form_id == form_id(a.form)


def test_a_host_name_without_digits_is_masked_only_as_the_logging_node() -> None:
    own = form_of("BarLib: lost heartbeat from alpha", host="alpha")
    assert own.form == "BarLib: lost heartbeat from <host>"
    assert form_of("BarLib: lost heartbeat from beta", host="beta") == own
    assert form_of("BarLib: lost heartbeat from alpha").form == "BarLib: lost heartbeat from alpha"


def test_other_messages_and_meaningful_codes_stay_apart() -> None:
    assert form_of("FooComm error: shard 3 stalled").form_id != form_of("FooComm warning: shard 3 stalled").form_id
    # Errno and status codes carry meaning (ml/normalize.py keeps them).
    assert form_of("OSError: [Errno 28] out of space").form_id != form_of("OSError: [Errno 5] out of space").form_id


def test_a_long_line_is_formed_from_its_head_and_clipped() -> None:
    head = "QuxDriver: fatal table overflow "
    one = form_of(head + "x" * 70_000)
    assert one == form_of(head + "x" * (FORM_CHARS + 5) + " tail that differs 123")
    assert len(one.form) <= EXAMPLE_CHARS
    assert clip("a\x00b" + "c" * 1000) == "ab" + "c" * (EXAMPLE_CHARS - 3)


def test_forms_normalize_each_line_once_and_past_the_budget_reuse_digit_only_variants() -> None:
    forms = Forms(budget=2)
    first = forms.of("ZapLib: ring 1 stuck", host="n1")
    assert forms.of("ZapLib: ring 1 stuck", host="n1") is first and forms.normalized == 1
    assert forms.of("ZapLib: ring 2 stuck", host="n1") == first and forms.normalized == 2
    # Over budget: a digit-only variant takes the earlier form without normalizing ...
    assert forms.of("ZapLib: ring 3 stuck", host="n1") is first and forms.normalized == 2
    # ... but a new shape is still normalized, exactly.
    other = forms.of("ZapLib: ring 3 wedged", host="n1")
    assert other.form == "ZapLib: ring <num> wedged" and forms.normalized == 3
    assert Forms().budget == BUDGET
