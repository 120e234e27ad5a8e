"""A launcher's restart resumes by itself (``ckpt_path=auto``), in a real ``torchrun
--max-restarts`` group of two CPU processes (gloo) whose rank 1 is SIGKILLed after step 3's
checkpoint (tests/faults.py's ``KillAtStep``: by step, never by time): torchrun starts the group
again, both ranks find ``TORCHELASTIC_RESTART_COUNT=1``, resume ``last.ckpt`` and end with exit
0, bitwise where test_ranks.py's uninterrupted run ends. One launch serves every assertion.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_ranks import ARGS, STEPS, _finish, reference  # noqa: F401 (a session fixture)
from training_state import assert_same_training_state, load_state

BIN = Path(sys.executable).parent
KILL = ("+callbacks.kill._target_=faults.KillAtStep", "+callbacks.kill.step=3",
        "+callbacks.kill.rank=1")  # fmt: skip


def _torchrun(root: Path, *extra: str, restarts: int = 3) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--max-restarts", str(restarts), str(BIN / "omnibert-train"), *ARGS,
        "accelerator.devices=2", f"paths.output_root={root}",
        f"hydra.run.dir={root / 'hydra'}", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[str], Path]:
    """The restarted run: its exit code, every output line, its output root."""
    tmp = tmp_path_factory.mktemp("elastic")
    code, lines = _finish(_torchrun(tmp / "runs", *KILL), tmp, "restarted")
    return code, lines, tmp / "runs"


def test_a_torchrun_restart_resumes_by_itself_bitwise(restarted, reference) -> None:  # noqa: F811
    code, lines, root = restarted
    text = "\n".join(lines)
    assert code == 0, text
    assert sum("KillAtStep: SIGKILL at global step 3" in line for line in lines) == 1, text
    # the first attempt started fresh; the restart resumed step 3 and says why
    starts = [
        line.split("resume from", 1)[1].strip() for line in lines if "  resume from  " in line
    ]
    checkpoint = root / "smoke" / "checkpoints" / "last.ckpt"
    why = "torchrun restarted the group (TORCHELASTIC_RESTART_COUNT=1), so ckpt_path=auto"
    assert starts[:2] == ["fresh run", "fresh run"], text
    assert starts[2:] == [f"{checkpoint} ({why}: this run's last checkpoint)"] * 2, text
    assert any(re.search(r"omnibert-train: rank 1 .*was lost", line) for line in lines), text
    assert_same_training_state(load_state(reference), load_state(checkpoint), STEPS)
