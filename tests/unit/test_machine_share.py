"""The suite's machine share (tests/support/machine_share.py): under `pytest -n 2` a test that measures has the
machine to itself. Two holders here are two MachineShare objects (flock locks belong to an open file, so they
exclude each other as two worker processes do)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.machine_share import MachineShare

pytestmark = pytest.mark.unit


def _soon(event: threading.Event) -> bool:
    return event.wait(2.0)


def test_an_alone_holder_waits_for_the_shared_one_and_a_later_shared_one_waits_for_it(tmp_path: Path) -> None:
    first, alone, later = MachineShare(tmp_path), MachineShare(tmp_path), MachineShare(tmp_path)
    first.shared()
    got_alone, got_later, order = threading.Event(), threading.Event(), []

    def take_alone() -> None:
        alone.alone()
        order.append("alone")
        got_alone.set()
        time.sleep(0.2)
        alone.release()

    def take_later() -> None:
        later.shared()
        order.append("later")
        got_later.set()
        later.release()

    t1 = threading.Thread(target=take_alone)
    t1.start()
    time.sleep(0.2)  # the alone holder now waits at the machine, holding the turnstile
    t2 = threading.Thread(target=take_later)
    t2.start()
    assert not got_alone.wait(0.3) and not got_later.is_set()  # both wait for the first holder
    first.release()
    assert _soon(got_alone) and _soon(got_later)
    t1.join(), t2.join()
    assert order == ["alone", "later"]  # the waiting alone holder went before a newer shared one
    for share in (first, alone, later):
        share.close()


def test_two_shared_holders_run_together_and_an_alone_spell_excludes_the_other(tmp_path: Path) -> None:
    a, b = MachineShare(tmp_path), MachineShare(tmp_path)
    a.shared()
    b.shared()  # at once: two workers' ordinary modules
    entered = threading.Event()

    def spell() -> None:
        b.begin_alone_spell()
        entered.set()
        b.end_alone_spell()

    thread = threading.Thread(target=spell)
    thread.start()
    assert not entered.wait(0.3)  # b's alone test waits while a's module holds the machine
    a.release()
    assert _soon(entered)
    thread.join()
    a.shared()  # b holds it shared again after its spell: a shares again at once
    a.close()
    b.close()


def test_consecutive_spells_keep_the_machine_and_the_other_shares_only_after_the_last(tmp_path: Path) -> None:
    a, b = MachineShare(tmp_path), MachineShare(tmp_path)
    a.shared()
    b.shared()
    a.release()  # a's module ended; its next one will ask for a shared hold
    b.begin_alone_spell()  # b's first alone test
    got = threading.Event()

    def a_next_module() -> None:
        a.shared()
        got.set()

    thread = threading.Thread(target=a_next_module)
    thread.start()
    assert not got.wait(0.3)  # a waits while b's spell lasts
    b.begin_alone_spell()  # b's second alone test: still its spell, no hand-over in between
    assert not got.wait(0.3)
    b.end_alone_spell()  # b's next test shares again: a gets in beside it
    assert _soon(got)
    thread.join()
    b.end_alone_spell()  # outside a spell: a no-op (b still holds it shared, beside a)
    a.close()
    b.close()


def test_a_shared_module_lets_a_waiting_alone_holder_in_between_its_tests(tmp_path: Path) -> None:
    """The alone holder waits for the other worker's current test, not its whole module."""
    module, alone = MachineShare(tmp_path), MachineShare(tmp_path)
    module.shared()
    module.let_an_alone_holder_in()  # nobody waits: the module keeps its hold (a no-op)
    got_alone, back = threading.Event(), threading.Event()

    def take_alone() -> None:
        alone.alone()
        got_alone.set()
        time.sleep(0.3)
        alone.release()

    thread = threading.Thread(target=take_alone)
    thread.start()
    assert not got_alone.wait(0.3)  # the module's current test still runs

    def next_test() -> None:
        module.let_an_alone_holder_in()  # the module's next test: it lets the alone holder in, then shares again
        back.set()

    follower = threading.Thread(target=next_test)
    follower.start()
    assert _soon(got_alone)
    assert not back.wait(0.1)  # the module's next test waits while the alone holder runs
    assert _soon(back)
    thread.join(), follower.join()
    module.close()
    alone.close()
