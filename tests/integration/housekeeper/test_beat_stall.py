"""Beat that lives on and schedules nothing is noticed: it exits to be restarted."""

from __future__ import annotations

from pathlib import Path

from inferq.host.stall import EXIT_STUCK
from tests.conftest import delete_keys, new_key_prefix, service_env
from tests.helpers.faulty_worker import SILENT_BEAT_VARIABLE
from tests.helpers.processes import FAULTY_INFERQ, ServiceProcess, log_contains

STALL_S = 10


def test_beat_that_sends_no_maintenance_exits(tmp_path: Path) -> None:
    prefix = new_key_prefix()
    env = service_env(
        model=tmp_path,  # beat loads no model and opens no database
        database_url="postgresql://nobody@127.0.0.1:1/unused",
        key_prefix=prefix,
        INFERQ_STALL_S=str(STALL_S),
        INFERQ_MAINTENANCE_INTERVAL_S="2",
        **{SILENT_BEAT_VARIABLE: "1"},
    )
    beat = ServiceProcess("beat", [*FAULTY_INFERQ, "beat"], env=env, log_dir=tmp_path)
    try:
        assert beat.process.wait(timeout=6 * STALL_S) == EXIT_STUCK, beat.log_tail()
        assert log_contains(beat, "beat does not send")(), beat.log_tail()
        assert log_contains(beat, "beat is stuck: ")(), beat.log_tail()
    finally:
        beat.discard()
        delete_keys(prefix)
