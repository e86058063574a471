"""The mps-agent's state file (:mod:`dra_driver.mpsagent.agent_state`): its text, each
share's kept from the write before, is what ``json.dumps`` of the document gives."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.agent_state import (
    STATE_VERSION,
    StateEncoder,
    load_state,
    save_state,
)
from dra_driver.mpsagent.protocol import ShareInfo


def share(n: int, **changes: object) -> ShareInfo:
    made = ShareInfo(
        gpu_uuid=f"GPU-{n % 2:08x}-1111-2222-3333-444444444444",
        share_id=f"share-{n}",
        claim_uid=f"uid-{n}",
        memory_limit_bytes=(n + 1) << 30,
        active_thread_percentage=25,
        uid=1000 if n % 2 else None,
        protocol="v3",
        namespace=f"s_p{n:011x}",
        pipe_dir=f"/run/fractional-gpu-dra/mps/g{n % 2}/s_p{n:011x}",
        shm_dir="/run/fractional-gpu-dra/mps/shm",
        tenant="team-ä" if n == 3 else None,  # not ASCII: escaped as json.dumps does
    )
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def dumped(shares: list[ShareInfo]) -> bytes:
    doc = {
        "version": STATE_VERSION,
        "protocol": "v3",
        "shares": [wire.share_to_json(s) for s in shares],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def test_each_write_is_the_documents_json_as_shares_come_change_and_go() -> None:
    encoder = StateEncoder()
    shares = [share(n) for n in range(4)]
    assert encoder.encode("v3", shares) == dumped(shares)
    # One share's limits changed (a new object), one released, one added.
    shares = [shares[0], share(1, memory_limit_bytes=7 << 30), shares[3], share(9)]
    assert encoder.encode("v3", shares) == dumped(shares)
    assert encoder.encode("v3", []) == dumped([])
    assert encoder.encode("v3", shares[:1]) == dumped(shares[:1])


def test_a_share_of_the_same_key_in_a_new_object_is_encoded_again() -> None:
    """The kept text serves only the very object it was made from (a share whose
    namespace changed keeps its GPU and id)."""
    encoder = StateEncoder()
    first = share(1)
    encoder.encode("v3", [first])
    renamed = share(1, namespace="s_p00000000abc")
    assert encoder.encode("v3", [renamed]) == dumped([renamed])


def test_saved_state_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "mps-agent-state.json")
    shares = [share(n) for n in range(3)]
    encoder = StateEncoder()
    save_state(path, "v3", shares, encoder)
    save_state(path, "v3", shares[1:], encoder)
    assert load_state(path) == shares[1:]
    save_state(path, "v3", shares)  # no encoder kept: one for this write
    assert load_state(path) == shares
