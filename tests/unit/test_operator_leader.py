"""The lease rule: take it when unheld, ours, or expired; never while another holder renews it."""

import datetime as dt

from tandem.operator.runtime.leader import lease_free

T = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_lease_rule():
    assert lease_free(None, None, 15, "me", T)
    assert lease_free("me", T, 15, "me", T)
    assert not lease_free("other", T, 15, "me", T + dt.timedelta(seconds=10))
    assert lease_free("other", T, 15, "me", T + dt.timedelta(seconds=16))


def test_check_reads_a_live_leader_from_the_lease():
    import datetime as dt

    from tandem.operator.runtime.check import lease_problem

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert lease_problem("op-1", now - dt.timedelta(seconds=5), 15, now) is None
    assert "expired" in lease_problem("op-1", now - dt.timedelta(seconds=20), 15, now)
    assert lease_problem(None, None, 15, now) == "no operator holds the lease"
