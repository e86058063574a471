"""CheckpointJournal: decisions batched into one write, PrepareStarted durable before the
answer, held claims decided again only after their transaction, the group commit.

Writes are counted by a CheckpointStore passed in that records each checkpoint it
saves; the node lock is held from "another plugin process" with a second NodeLock on
the same file (flock locks belong to the open file, as across processes). Ordering is
by events: nothing here waits for a time to pass."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.base.errors import CheckpointError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.plugin.journal import CheckpointJournal
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, CheckpointStore, ClaimState
from dra_driver.state.locks import NodeLock

STARTED, DONE = ClaimState.PREPARE_STARTED, ClaimState.PREPARE_COMPLETED


class RecordingStore(CheckpointStore):
    """The real store, recording each checkpoint it writes; ``fail_next`` fails a write
    as a full disk does."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "boot")
        self.written: list[dict[str, ClaimState]] = []
        self.fail_next = False

    def save(self, checkpoint: Checkpoint) -> None:
        if self.fail_next:
            self.fail_next = False
            raise CheckpointError(f"cannot write checkpoint {self.path}: no space left")
        super().save(checkpoint)
        self.written.append({c.ref.name: c.state for c in checkpoint.claims.values()})


def ref(name: str) -> ClaimRef:
    return ClaimRef("ns", name, ClaimUID(f"uid-{name}"))


def start(name: str) -> Callable[[Checkpoint], tuple[Checkpoint, ClaimState | None]]:
    """A prepare's decision: record PrepareStarted, answer the state it found."""

    def decide(checkpoint: Checkpoint) -> tuple[Checkpoint, ClaimState | None]:
        found = checkpoint.claims.get(ref(name).uid)
        if found is not None and found.state is DONE:
            return checkpoint, DONE  # prepared already: nothing to write
        return checkpoint.with_claim(CheckpointClaim(ref(name), STARTED)), None

    return decide


def complete(name: str) -> Callable[[Checkpoint], Checkpoint]:
    return lambda checkpoint: checkpoint.with_claim(CheckpointClaim(ref(name), DONE))


def journal_on(tmp_path: Path) -> tuple[CheckpointJournal, RecordingStore]:
    store = RecordingStore(str(tmp_path / "checkpoint.json"))
    return CheckpointJournal(store, NodeLock(str(tmp_path / "serialize.lock"))), store


async def settled() -> None:
    """Let every ready task run until none is ready (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_claims_waiting_together_are_decided_in_one_write(tmp_path: Path) -> None:
    journal, store = journal_on(tmp_path)

    async def scenario() -> list[ClaimState | None]:
        async def prepare(name: str) -> ClaimState | None:
            async with journal.decision(ref(name).uid, start(name)) as found:
                # Durable before the caller's first side effect: another reader sees it.
                on_disk = CheckpointStore(store.path, "boot").load().claims
                assert on_disk[ref(name).uid].state is STARTED
                await journal.record(complete(name))
                return found

        found = await asyncio.gather(*(prepare(n) for n in ("a", "b", "c")))
        await journal.close()
        return found

    assert asyncio.run(scenario()) == [None, None, None]
    # One write for the three decisions, one for the three completions (group commit).
    assert store.written == [
        {"a": STARTED, "b": STARTED, "c": STARTED},
        {"a": DONE, "b": DONE, "c": DONE},
    ]


def test_a_completion_waiting_for_the_lock_shares_the_next_decisions_write(
    tmp_path: Path,
) -> None:
    """A's completion and B's decision both wait while another process holds the node
    lock: one write records A completed and B started (not two in a row); then B's
    completion."""
    journal, store = journal_on(tmp_path)
    other_process = NodeLock(journal.lock.path, poll_interval=0.001)

    async def scenario() -> None:
        a_decided, a_may_finish = asyncio.Event(), asyncio.Event()

        async def prepare(name: str, decided: asyncio.Event, may_finish: asyncio.Event) -> None:
            async with journal.decision(ref(name).uid, start(name)):
                decided.set()
                await may_finish.wait()  # its side effects
                await journal.record(complete(name))

        call_a = asyncio.create_task(prepare("a", a_decided, a_may_finish))
        await a_decided.wait()
        assert store.written == [{"a": STARTED}]
        async with other_process.hold():
            at_once = asyncio.Event()
            at_once.set()
            call_b = asyncio.create_task(prepare("b", asyncio.Event(), at_once))
            a_may_finish.set()  # A's completion now waits for the lock, as B's decision does
            await settled()
            assert store.written == [{"a": STARTED}], "written under another's lock"
        await asyncio.gather(call_a, call_b)
        await journal.close()

    asyncio.run(scenario())
    other_process.close()
    journal.lock.close()
    assert store.written == [
        {"a": STARTED},
        {"a": DONE, "b": STARTED},
        {"a": DONE, "b": DONE},
    ]


def test_a_held_claim_is_decided_again_only_after_its_transaction(tmp_path: Path) -> None:
    journal, store = journal_on(tmp_path)

    async def scenario() -> list[str]:
        order: list[str] = []
        first_in = asyncio.Event()
        first_may_leave = asyncio.Event()

        async def first() -> None:
            async with journal.decision(ref("a").uid, start("a")):
                first_in.set()
                await first_may_leave.wait()
                await journal.record(complete("a"))
                order.append("first done")

        async def second() -> None:
            async with journal.decision(ref("a").uid, start("a")) as found:
                order.append(f"second decided: {found}")

        one = asyncio.create_task(first())
        await first_in.wait()
        two = asyncio.create_task(second())
        await settled()
        # A later claim's decision: the writer has passed the second one by when it is
        # answered (decisions go in arrival order), and left it waiting.
        async with journal.decision(ref("b").uid, start("b")):
            pass
        assert order == [], "decided while the first transaction was in flight"
        first_may_leave.set()
        await asyncio.gather(one, two)
        await journal.close()
        return order

    assert asyncio.run(scenario()) == ["first done", "second decided: PrepareCompleted"]
    # The repeat writes nothing.
    assert store.written == [
        {"a": STARTED},
        {"a": STARTED, "b": STARTED},
        {"a": DONE, "b": STARTED},
    ]


def test_a_failed_write_fails_its_pass_and_holds_nothing(tmp_path: Path) -> None:
    journal, store = journal_on(tmp_path)

    async def scenario() -> None:
        store.fail_next = True
        with pytest.raises(CheckpointError, match="no space left"):
            async with journal.decision(ref("a").uid, start("a")):
                pytest.fail("answered although nothing was written")
        # Not held: the kubelet's retry is decided at once.
        async with journal.decision(ref("a").uid, start("a")) as found:
            assert found is None
        await journal.close()

    asyncio.run(scenario())
    assert store.written == [{"a": STARTED}]


def test_a_decision_that_raises_fails_only_its_claim(tmp_path: Path) -> None:
    journal, store = journal_on(tmp_path)

    def broken(checkpoint: Checkpoint) -> tuple[Checkpoint, None]:
        raise ValueError("bug in one claim's plan")

    async def scenario() -> None:
        async def bad() -> None:
            with pytest.raises(ValueError, match="bug"):
                async with journal.decision(ref("bad").uid, broken):
                    pass

        async def good() -> None:
            async with journal.decision(ref("good").uid, start("good")) as found:
                assert found is None

        await asyncio.gather(bad(), good())
        await journal.close()

    asyncio.run(scenario())
    assert store.written == [{"good": STARTED}]


class GatedStore(RecordingStore):
    """A store whose writes wait (in the writer's thread) until ``opened`` is set."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.opened = threading.Event()
        self.writing = threading.Event()

    def save(self, checkpoint: Checkpoint) -> None:
        self.writing.set()
        assert self.opened.wait(30), "never opened"
        super().save(checkpoint)


def test_on_decided_hears_the_decision_while_it_is_written(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path / "checkpoint.json"))
    journal = CheckpointJournal(store, NodeLock(str(tmp_path / "serialize.lock")))

    async def scenario() -> None:
        heard: list[tuple[str, ClaimState | None, bool]] = []

        def on_decided(name: str) -> Callable[[ClaimState | None], None]:
            def told(found: ClaimState | None) -> None:
                # Told on the event loop, before the write is on disk.
                asyncio.get_running_loop()
                heard.append((name, found, bool(store.written)))
                store.opened.set()

            return told

        async def prepare(name: str) -> None:
            async with journal.decision(ref(name).uid, start(name), on_decided(name)):
                pass

        await asyncio.gather(prepare("a"), prepare("b"))
        assert heard == [("a", None, False), ("b", None, False)]
        await journal.close()

    asyncio.run(scenario())
    assert store.written == [{"a": STARTED, "b": STARTED}]


def test_on_decided_is_not_told_of_a_failed_decision_and_a_failed_write_still_fails(
    tmp_path: Path,
) -> None:
    journal, store = journal_on(tmp_path)

    def broken(checkpoint: Checkpoint) -> tuple[Checkpoint, None]:
        raise ValueError("a bug in this claim's plan")

    async def scenario() -> None:
        heard: list[str] = []
        with pytest.raises(ValueError, match="a bug"):
            async with journal.decision(ref("a").uid, broken, lambda _: heard.append("a")):
                pass
        assert heard == []
        store.fail_next = True
        with pytest.raises(CheckpointError, match="no space left"):
            async with journal.decision(ref("b").uid, start("b"), lambda _: heard.append("b")):
                pass
        assert heard == ["b"], "told before the write, which then failed"
        await journal.close()

    asyncio.run(scenario())
    assert store.written == []
