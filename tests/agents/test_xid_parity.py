"""The agent's Xid table (agents/parsers/xid.py, which may not import ml/) and the service's reading of the
catalog (ml/xid.py) must agree: the same codes and actions, and every Xid the service evicts on is one the
agent ships at once, so it is decided by the fast pass rather than at the next ship tick and periodic pass."""

from __future__ import annotations

from agents.parsers import xid as agent_xid
from ml import xid as service_xid


def test_both_tables_hold_the_same_codes_and_immediate_actions():
    catalog = service_xid.catalog()
    assert set(agent_xid.XID_CATALOG) == set(catalog)
    for code, (_mnemonic, action) in agent_xid.XID_CATALOG.items():
        assert action == catalog[code].immediate_action, code


def test_the_actions_that_mean_a_reset_or_reboot_are_the_same_set():
    assert agent_xid.CRITICAL_ACTIONS == service_xid._FATAL_ACTIONS


def test_every_xid_the_service_evicts_on_is_shipped_at_once():
    evicts = {code for code, entry in service_xid.catalog().items() if entry.action == "evict"}
    assert evicts, "the catalog did not load"
    not_urgent = sorted(code for code in evicts if not agent_xid.lookup(code).critical)
    assert not_urgent == [], f"the service evicts on these, the agent ships them at the next tick: {not_urgent}"
    assert evicts <= agent_xid.CRITICAL_XIDS


def test_the_agent_raises_only_codes_the_service_evicts_on():
    # 63 (a row marked for remapping) asks for nothing (issue 41): not an emergency. 94 (contained ECC) takes a
    # reset of its GPU: shipped at once. No code is raised over its catalog action without an action behind it.
    evicts = {code for code, entry in service_xid.catalog().items() if entry.action == "evict"}
    assert agent_xid._RAISED_TO_CRITICAL.issubset(evicts)
    assert 63 not in evicts and 63 not in agent_xid.CRITICAL_XIDS
    assert service_xid.lookup(94).gpu_reset_enough and 94 in agent_xid.CRITICAL_XIDS
    assert {64, 94, 95} <= evicts <= agent_xid.CRITICAL_XIDS
