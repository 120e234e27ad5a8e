"""LAMB (and AdamW) sharded across data-parallel ranks, ZeRO stage 1
(``accelerator.optimizer_sharding=zero1``, :mod:`omnibert.optim.zero1`), equals the unsharded
optimiser.

* **The optimiser, on 4 and 2 gloo processes** (one ``torch.distributed.run`` launch of
  ``lamb_zero1_worker.py``): the tiny BERT trained side by side with the unsharded optimiser
  and with :class:`~omnibert.optim.zero1.Zero1Optimizer` over the same config, each rank its
  own batch and the gradients averaged, as DDP does; LAMB clipped and not, the MLPerf rules
  (no clipping in the optimiser, the trust ratio by name), the multi-tensor Triton kernel
  (interpreted, 2 ranks, one step), AdamW (2 ranks); weight-decay and no-decay groups in
  every case.
  Every step's parameters are within 1e-6 (per tensor, ``‖p_zero1 - p‖ / ‖p‖``) of the
  unsharded ones, and bitwise equal where the optimiser does not clip: then every number of
  the sharded step is the unsharded step's. Where it clips, the global norm's squares are
  summed in another order (per rank, then over ranks): measured at most 1.8e-7 after 3 steps
  on 4 ranks, 0 on 2. The control (the same case with each rank's norm its own tensors' only)
  ends far outside the tolerance. The partition torch makes is the one the plan predicts. The
  consolidated checkpoint has the unsharded optimiser's groups and state keys and holds each
  rank's state bitwise; a sharded optimiser that loads it continues bitwise; a sharded one
  loading the unsharded state, and an unsharded one loading the consolidated state, continue
  within 1e-6 of the unsharded run. A step whose averaged gradient holds a NaN (in one
  rank's tensor) is skipped by every rank, as the unsharded optimiser skips it: the global
  norm that decides it is summed over the ranks.
* **The training path**: ``torchrun`` with 2 ``omnibert-train`` processes and ``zero1``
  resumes the unsharded reference run of ``test_ranks.py`` (Lightning's launcher) from its
  step 4, each rank holding the state of part of the tensors; its step 6 is within 1e-6 of
  the reference's and its checkpoint is a normal one (the reference's groups and state keys).
  Resuming the sharded checkpoint it writes is the same load (the same format), checked
  bitwise on the optimiser above.
* **Refusals and the plan**: one sentence where zero1 cannot apply, before any compute; the
  plan's optimiser-state line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_ranks import _command, _finish, _last, reference  # noqa: F401 (the fixture)
from training_state import load_state

from omnibert.accelerators.base import AcceleratorError
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.gpu import GPUPlugin
from omnibert.accelerators.hpu import HPUPlugin
from omnibert.accelerators.ipu import IPUPlugin
from omnibert.config import TrainConfig
from omnibert.optim.zero1_plan import elements_per_rank

WORKER = Path(__file__).parents[1] / "lamb_zero1_worker.py"
TOLERANCE = 1e-6
#: cases whose optimiser does not clip: the sharded step is the unsharded one, bit for bit
UNCLIPPED = ("lamb-unclipped", "lamb-mlperf", "adamw")
CONTROL = "lamb-clipped-local-norm-control"
NONFINITE = "lamb-nonfinite-skipped"


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("zero1")
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"),
        *(str(WORKER), f"--out-dir={out}"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["TRITON_INTERPRET"] = "1"  # the Triton case on CPU
    done = subprocess.run(
        cmd, cwd=WORKER.parent, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results: dict = json.loads((out / "zero1.json").read_text())
    return results


@pytest.mark.parametrize("world", [2, 4])
def test_zero1_steps_are_the_unsharded_steps(launched, world):
    cases = launched[str(world)]
    two_only = {"lamb-triton-interpreted", CONTROL, NONFINITE, "adamw"} if world == 2 else set()
    expected = {"lamb-clipped", "lamb-unclipped", "lamb-mlperf"} | two_only
    assert set(cases) == expected
    for name, case in cases.items():
        shares = case["elements_per_rank"]
        assert len(shares) == world and min(shares) > 0, name  # every rank holds a part
        assert shares == case["predicted_elements_per_rank"], name  # the plan's prediction
        if name == CONTROL:  # a norm over one rank's tensors only: the check catches it
            assert max(case["param"]) > 100 * TOLERANCE, case["param"]
            continue
        assert max(case["param"]) <= TOLERANCE, (name, case["param"])
        if name in UNCLIPPED:
            assert all(case["bitwise"]), name
    if world == 2:  # step 2's NaN: every rank skips it and leaves its tensors as they were
        flags = cases[NONFINITE]["skipped"]
        assert flags == [[[False, False]] * 2, [[True, True]] * 2, [[False, False]] * 2], flags


@pytest.mark.parametrize("world", [2, 4])
def test_zero1_checkpoints_are_unsharded_ones_and_resume(launched, world):
    report = launched[str(world)]["lamb-clipped"]["checkpoint"]
    assert report["groups_equal"] and report["state_keys_equal"], report
    assert report["state_is_the_ranks"], report  # nothing lost or changed in consolidating
    assert report["resumed_bitwise"], report
    assert report["sharded_from_unsharded_distance"] <= TOLERANCE, report
    assert report["unsharded_from_sharded_distance"] <= TOLERANCE, report


SHARE = re.compile(
    r"OptimizerShare: rank (\d) (\w+) holds (\d+) of (\d+) tensors, (\d+) of (\d+) elements"
)


def test_a_zero1_run_resumes_an_unsharded_checkpoint_and_writes_a_normal_one(
    reference,  # noqa: F811 (the fixture)
    tmp_path,
):
    root = tmp_path / "zero1"
    step4 = reference.parent / "step-00000004.ckpt"
    command = _command(
        "torchrun", root, "zero1", "accelerator.optimizer_sharding=zero1", f"ckpt_path={step4}",
        "+callbacks.share._target_=zero1_probe.OptimizerShare",
    )  # fmt: skip
    code, lines = _finish(command, tmp_path, "zero1")
    assert code == 0, "\n".join(lines)
    shares = sorted(m.groups() for line in lines if (m := SHARE.search(line)))
    assert [s[:2] for s in shares] == [("0", "Zero1Optimizer"), ("1", "Zero1Optimizer")]
    held, tensors, elements, total = (
        [int(s[i]) for s in shares] for i in (2, 3, 4, 5)
    )  # fmt: skip
    assert sum(held) == tensors[0] and sum(elements) == total[0] and max(elements) < total[0]
    plan = [line for line in lines if line.strip().startswith("optimizer state")]
    assert plan and all("per rank at most (zero1 over 2 ranks" in line for line in plan), plan
    got, want = load_state(_last(root)), load_state(reference)
    assert got["global_step"] == want["global_step"] == 6
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for name, tensor in want["state_dict"].items():
        if tensor.is_floating_point():
            distance = (got["state_dict"][name] - tensor).norm() / tensor.norm().clamp(min=1e-30)
            assert distance <= TOLERANCE, (name, float(distance))
        else:
            assert torch.equal(got["state_dict"][name], tensor), name
    mine, theirs = got["optimizer_states"][0], want["optimizer_states"][0]
    assert mine["param_groups"] == theirs["param_groups"]  # names, step counts, LRs
    assert mine["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        assert {k: (v.shape, v.dtype) for k, v in mine["state"][index].items()} == {
            k: (v.shape, v.dtype) for k, v in state.items()
        }


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: CPUPlugin(devices=1, optimizer_sharding="zero1"), "this run has one"),
        (lambda: CPUPlugin(devices=2, optimizer_sharding="zero2"), "is not one of none, zero1"),
        (
            lambda: GPUPlugin(devices=2, strategy="fsdp", optimizer_sharding="zero1"),
            "not of accelerator.strategy=fsdp (FSDP shards the optimiser already)",
        ),
        (lambda: HPUPlugin(devices=8, optimizer_sharding="zero1"), "accelerator=hpu has no"),
        (lambda: IPUPlugin(devices=4, optimizer_sharding="zero1"), "accelerator=ipu has no"),
        (
            lambda: GPUPlugin(devices=8, optimizer_sharding="zero1").check_optimizer(
                {"_target_": "omnibert.optim.vendor.habana_lamb"}
            ),
            "omnibert.optim.vendor.habana_lamb is not known to update them exactly",
        ),
    ],
    ids=["one-process", "unknown", "fsdp", "hpu", "ipu", "vendor-optimizer"],
)
def test_zero1_is_refused_in_one_sentence_where_it_cannot_apply(make, fragment):
    with pytest.raises(AcceleratorError) as info:
        make()
    message = str(info.value)
    assert fragment in message and "accelerator.optimizer_sharding=none" in message, message
    assert message.count(". ") == 0 and message.endswith("."), message


def test_the_app_refuses_zero1_on_one_process_before_writing(tmp_path, capsys, compose_config):
    from omnibert.apps.train import run_or_exit

    out = tmp_path / "out"
    cfg = compose_config(
        "experiment=smoke", f"paths.output_root={tmp_path}", "accelerator.optimizer_sharding=zero1"
    )
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, out)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "accelerator.optimizer_sharding=zero1" in err[0], err
    assert not out.exists()


def test_the_plan_prints_the_optimizer_state_per_rank(tmp_path, compose_config):
    """The line's numbers are the partition of the groups the run's optimiser makes."""
    from omnibert.models import BertForPreTraining
    from omnibert.optim.build import build_optimizer
    from omnibert.run.pretraining.job import prepare

    cfg = compose_config(
        "experiment=smoke", f"paths.output_root={tmp_path}", "accelerator.devices=2",
        "accelerator.optimizer_sharding=zero1",
    )  # fmt: skip
    prepared = prepare(TrainConfig.of(cfg))
    line = prepared.plan.kernels["optimizer state"]
    model = BertForPreTraining(prepared.plan.model)
    groups = build_optimizer(prepared.config.optimizer, model.named_parameters()).param_groups
    shares = elements_per_rank([[p.numel() for p in g["params"]] for g in groups], 2)
    total = sum(shares)
    assert line == (
        f"{max(shares) * 8 / 1024:.1f} KiB per rank at most (zero1 over 2 ranks, whole tensors: "
        f"{min(shares):,} to {max(shares):,} parameters each) against {total * 8 / 1024:.1f} "
        f"KiB (8 B x {total:,} parameters) unsharded"
    )
    unsharded = prepare(
        TrainConfig.of(compose_config("experiment=smoke", f"paths.output_root={tmp_path}"))
    )
    assert unsharded.plan.kernels["optimizer state"] == (
        f"{total * 8 / 1024:.1f} KiB (8 B x {total:,} parameters)"
    )


def test_parameters_of_several_dtypes_are_refused_in_one_sentence(tmp_path):
    """torch's ZeroRedundancyOptimizer takes parameters of one dtype (its buckets have one):
    a model with fp32 and bf16 tensors is refused naming the setting (one gloo rank here)."""
    import functools

    import torch.distributed as dist

    from omnibert.errors import UserError
    from omnibert.optim import Lamb
    from omnibert.optim.zero1 import Zero1Optimizer

    named = [
        (f"w{i}", torch.nn.Parameter(torch.ones(4, dtype=dtype)))
        for i, dtype in enumerate((torch.float32, torch.bfloat16))
    ]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError) as info:
            Zero1Optimizer(functools.partial(Lamb, lr=0.1), named)
    finally:
        dist.destroy_process_group()
    message = str(info.value)
    assert "are bfloat16 and float32; set accelerator.optimizer_sharding=none." in message
    assert message.count(". ") == 0, message
