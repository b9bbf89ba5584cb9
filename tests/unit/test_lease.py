"""The lease book: which messages are held, and which to extend or let go."""

from __future__ import annotations

import pytest

from streamsub._core.lease import LeaseBook, LeaseDue


def book(ack_deadline: float = 30.0, max_lease_duration: float = 3600.0) -> LeaseBook[str]:
    """A lease book keyed by message name."""
    return LeaseBook(ack_deadline=ack_deadline, max_lease_duration=max_lease_duration)


def test_extend_interval_is_a_third_of_the_ack_deadline() -> None:
    """Leases are extended three times per ack deadline, so two extensions may be late."""
    assert book(ack_deadline=30.0).extend_interval == pytest.approx(10.0)
    assert book(ack_deadline=10.0).extend_interval == pytest.approx(10.0 / 3)


def test_new_book_is_empty() -> None:
    """A new lease book holds nothing and has nothing due."""
    leases = book()
    assert len(leases) == 0
    assert "a" not in leases
    assert leases.due(0.0) == LeaseDue([], [])


def test_add_holds_the_lease() -> None:
    """A received message is held until removed."""
    leases = book()
    leases.add("a", now=0.0)
    leases.add("b", now=0.0)
    assert len(leases) == 2
    assert "a" in leases
    assert "b" in leases


def test_remove_reports_whether_the_lease_was_held() -> None:
    """remove returns True for a held lease and False once it is gone or never was."""
    leases = book()
    leases.add("a", now=0.0)
    assert leases.remove("a") is True
    assert leases.remove("a") is False
    assert leases.remove("never") is False
    assert "a" not in leases
    assert len(leases) == 0


def test_remove_many_ends_each_lease_and_ignores_those_not_held() -> None:
    """remove_many takes out every listed lease, a moved deadline's limit with it,
    and leaves the others."""
    leases = book(max_lease_duration=100.0)
    for name in ("a", "b", "c"):
        leases.add(name, now=0.0)
    leases.set_deadline("b", now=0.0, seconds=5.0)
    leases.remove_many(["a", "b", "never"])
    assert len(leases) == 1
    assert "c" in leases
    assert leases.due(50.0) == LeaseDue(["c"], [])
    leases.add("b", now=50.0)  # delivered again: a lease of its own, to 150
    assert leases.set_deadline("b", now=60.0, seconds=200.0)
    assert leases.due(120.0) == LeaseDue(["b"], ["c"])
    assert leases.due(150.0) == LeaseDue([], ["b"])


def test_removed_lease_is_never_due() -> None:
    """A settled message is neither extended nor expired."""
    leases = book()
    leases.add("a", now=0.0)
    leases.remove("a")
    assert leases.due(10.0) == LeaseDue([], [])
    assert leases.due(10_000.0) == LeaseDue([], [])


def test_due_extends_leases_before_max_lease_duration() -> None:
    """A held lease younger than max_lease_duration is due for extension."""
    leases = book(max_lease_duration=60.0)
    leases.add("a", now=0.0)
    assert leases.due(10.0) == LeaseDue(["a"], [])
    assert leases.due(59.999) == LeaseDue(["a"], [])
    assert "a" in leases


def test_due_expires_leases_at_max_lease_duration() -> None:
    """A lease ends max_lease_duration after receipt and leaves the book."""
    leases = book(max_lease_duration=60.0)
    leases.add("a", now=0.0)
    assert leases.due(60.0) == LeaseDue([], ["a"])
    assert "a" not in leases
    assert leases.due(61.0) == LeaseDue([], [])


def test_due_splits_leases_by_their_own_receipt_times() -> None:
    """Each lease ends relative to its own receipt; due returns both kinds at once."""
    leases = book(max_lease_duration=60.0)
    leases.add("old", now=0.0)
    leases.add("new", now=30.0)
    leases.add("newer", now=45.0)
    due = leases.due(70.0)
    assert due.expired == ["old"]
    assert sorted(due.extend) == ["new", "newer"]
    assert len(leases) == 2


def test_set_deadline_shortens_the_lease() -> None:
    """set_deadline ends the lease seconds after now."""
    leases = book()
    leases.add("a", now=0.0)
    assert leases.set_deadline("a", now=100.0, seconds=5.0) is True
    assert leases.due(104.0) == LeaseDue(["a"], [])
    assert leases.due(105.0) == LeaseDue([], ["a"])


def test_set_deadline_can_lengthen_a_shortened_lease() -> None:
    """A later set_deadline replaces an earlier one, within the cap."""
    leases = book()
    leases.add("a", now=0.0)
    leases.set_deadline("a", now=0.0, seconds=5.0)
    leases.set_deadline("a", now=4.0, seconds=30.0)
    assert leases.due(33.0) == LeaseDue(["a"], [])
    assert leases.due(34.0) == LeaseDue([], ["a"])


def test_set_deadline_is_capped_at_max_lease_duration_after_receipt() -> None:
    """No deadline reaches past max_lease_duration after the message was received."""
    leases = book(max_lease_duration=60.0)
    leases.add("a", now=10.0)
    assert leases.set_deadline("a", now=50.0, seconds=600.0) is True
    assert leases.due(69.0) == LeaseDue(["a"], [])
    assert leases.due(70.0) == LeaseDue([], ["a"])


def test_set_deadline_of_zero_ends_the_lease_now() -> None:
    """A deadline of zero seconds makes the lease expire at the next due."""
    leases = book()
    leases.add("a", now=0.0)
    leases.set_deadline("a", now=5.0, seconds=0.0)
    assert leases.due(5.0) == LeaseDue([], ["a"])


def test_set_deadline_returns_false_for_unknown_keys() -> None:
    """set_deadline on a lease never held returns False and holds nothing."""
    leases = book()
    assert leases.set_deadline("ghost", now=0.0, seconds=10.0) is False
    assert "ghost" not in leases
    assert len(leases) == 0


def test_set_deadline_returns_false_after_remove_or_expiry() -> None:
    """set_deadline on a settled or expired lease returns False and does not revive it."""
    leases = book(max_lease_duration=60.0)
    leases.add("settled", now=0.0)
    leases.add("expired", now=0.0)
    leases.remove("settled")
    leases.due(60.0)
    assert leases.set_deadline("settled", now=61.0, seconds=10.0) is False
    assert leases.set_deadline("expired", now=61.0, seconds=10.0) is False
    assert len(leases) == 0
    assert leases.due(62.0) == LeaseDue([], [])


def test_re_adding_a_lease_starts_a_fresh_limit() -> None:
    """A message received again (e.g. reclaimed) gets a new max_lease_duration from then."""
    leases = book(max_lease_duration=60.0)
    leases.add("a", now=0.0)
    leases.remove("a")
    leases.add("a", now=100.0)
    assert leases.set_deadline("a", now=100.0, seconds=600.0) is True
    assert leases.due(159.0) == LeaseDue(["a"], [])
    assert leases.due(160.0) == LeaseDue([], ["a"])


def test_keys_may_be_any_hashable() -> None:
    """Leases are keyed by (partition, entry id) tuples in the engine."""
    leases: LeaseBook[tuple[int, str]] = LeaseBook(ack_deadline=30.0, max_lease_duration=60.0)
    leases.add((3, "1-0"), now=0.0)
    assert (3, "1-0") in leases
    assert leases.due(1.0) == LeaseDue([(3, "1-0")], [])
