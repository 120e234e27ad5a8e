"""The defaults of a run with no tuning flags: the micro batch the speed probe chooses
(omnibert.run.sizing.speed_probe), the resumed run's micro batch, and the CPU's precision rule.

The selection logic is tested on fake timings (no test here depends on how fast this machine
is); the probe itself runs once on a real tiny model to show it times, caches and leaves the
run's random state alone."""

from __future__ import annotations

import json

import pytest
import torch

from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.cpu_bf16 import Bf16Support
from omnibert.apps.compose import compose
from omnibert.apps.train import run as train
from omnibert.config import TrainConfig
from omnibert.errors import UserError
from omnibert.models import BertConfig
from omnibert.run.pretraining.batches import data_and_batches
from omnibert.run.sizing import speed_probe
from omnibert.run.sizing.speed_probe import candidate_sizes, choose_fastest, probe_micro_batch


class FakeClock:
    """A clock that the fake passes advance: the budget rule sees their 'seconds'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timings(clock: FakeClock, per_row: dict[int, float], calls: list[int]):
    """``seconds_per_pass`` of a machine where a row costs ``per_row[size]`` seconds at
    ``size``; each call (a warm-up and a timed pass) advances the clock twice the pass."""

    def seconds(size: int) -> float:
        calls.append(size)
        elapsed = size * per_row[size]
        clock.now += 2 * elapsed
        return elapsed

    return seconds


def test_candidates_are_the_fitting_size_and_quarter_steps_that_divide_the_batch():
    assert candidate_sizes(1024, 65536, packed=False) == [16, 64, 256, 1024]
    assert candidate_sizes(32, 32, packed=False) == [8, 32]  # none below 4
    assert candidate_sizes(24, 24, packed=False) == [6, 24]  # 24 // 4 = 6 divides 24
    assert candidate_sizes(20, 60, packed=False) == [5, 20]
    assert candidate_sizes(19, 19, packed=False) == [19]  # 19 // 4 = 4 does not divide: 1
    assert candidate_sizes(1, 8, packed=False) == [1]
    assert candidate_sizes(28, 100, packed=True) == [7, 28]


def test_the_fastest_size_wins_and_a_falling_rate_ends_the_probe():
    clock, calls = FakeClock(), []
    # a CPU whose caches the large sizes overflow: 64 rows is the fastest per row
    per_row = {16: 0.010, 64: 0.006, 256: 0.009, 1024: 0.030}
    result = choose_fastest([16, 64, 256, 1024], timings(clock, per_row, calls), 60, clock, 0.0)
    assert result.size == 64
    assert [s for s, _ in result.rates] == [16, 64, 256]
    assert result.untried == (1024,)  # 256 fell more than 10 % below 64: 1024 is not timed
    assert calls == [16, 64, 256]
    assert dict(result.rates)[64] == pytest.approx(1 / 0.006, rel=1e-3)
    assert "64 → 166.7" in result.describe() and "not timed: 1024" in result.describe()


def test_rates_within_the_tolerance_go_to_the_larger_size_as_on_a_gpu():
    clock, calls = FakeClock(), []
    gpu = {16: 0.004, 64: 0.001, 256: 0.0003, 1024: 0.0003 * 1.02}  # flat from 256 on
    result = choose_fastest([16, 64, 256, 1024], timings(clock, gpu, calls), 60, clock, 0.0)
    assert result.size == 1024 and result.untried == ()


def test_the_loops_own_time_per_micro_batch_favours_the_larger_size():
    # 8 rows 11 % faster per row than 32 when only the forward and backward count
    per_row = {8: 1 / 120.0, 32: 1 / 108.0}
    clock, calls = FakeClock(), []
    assert choose_fastest([8, 32], timings(clock, per_row, calls), 60, clock, 0.0).size == 8
    clock, calls = FakeClock(), []
    result = choose_fastest([8, 32], timings(clock, per_row, calls), 60, clock, 0.010)
    assert result.size == 32  # 10 ms a micro-batch: 104.3 against 104.5 rows/s
    assert dict(result.rates)[8] == pytest.approx(8 / (8 / 120.0 + 0.010), rel=1e-3)


def test_a_size_projected_past_the_budget_is_not_timed():
    clock, calls = FakeClock(), []
    slow = {16: 0.2, 64: 0.2, 256: 0.2, 1024: 0.2}  # 3.2 s a pass at 16: 64 would take ~26 s
    result = choose_fastest([16, 64, 256, 1024], timings(clock, slow, calls), 20, clock, 0.0)
    assert calls == [16] and result.size == 16 and result.untried == (64, 256, 1024)


TINY = BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)  # fmt: skip
SHAPES = {"input_ids": [1, 32], "masked_lm_positions": [1, 5], "nsp_labels": [1, 2]}


def test_the_probe_times_a_real_model_caches_its_choice_and_keeps_the_rng(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIBERT_CACHE_DIR", str(tmp_path / "cache"))
    batch = speed_probe.probe_batch(SHAPES, 3, TINY.vocab_size, "cpu")
    assert batch["sequence_ids"][0].tolist() == [1] * 16 + [2] * 16
    assert batch["position_ids"][0, 16].item() == 0 and batch["nsp_positions"][0].tolist() == [
        0,
        16,
    ]
    torch.manual_seed(7)
    before = torch.get_rng_state()
    result = probe_micro_batch(TINY, SHAPES, precision="32-true", device=torch.device("cpu"),
                               candidates=[2, 8])  # fmt: skip
    assert torch.equal(torch.get_rng_state(), before)  # the run's initial weights are unchanged
    assert result.size in (2, 8) and result.cached is None
    assert [s for s, _ in result.rates] == [2, 8] and all(r > 0 for _, r in result.rates)
    table = json.loads((tmp_path / "cache" / "micro_batch_probe.json").read_text())
    (entry,) = table.values()
    assert entry["size"] == result.size and entry["key"]["precision"] == "32-true"
    again = probe_micro_batch(TINY, SHAPES, precision="32-true", device=torch.device("cpu"),
                              candidates=[2, 8])  # fmt: skip
    assert again.size == result.size and again.rates == result.rates
    assert again.cached == str(tmp_path / "cache" / "micro_batch_probe.json")
    other = probe_micro_batch(TINY, SHAPES, precision="32-true", device=torch.device("cpu"),
                              candidates=[1, 4])  # another key: timed again  # fmt: skip
    assert (
        other.cached is None
        and len(json.loads((tmp_path / "cache" / "micro_batch_probe.json").read_text())) == 2
    )


def test_an_unwritable_cache_is_said_and_the_probe_still_chooses(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("OMNIBERT_CACHE_DIR", str(blocker / "sub"))
    result = probe_micro_batch(TINY, SHAPES, precision="32-true", device=torch.device("cpu"),
                               candidates=[1, 2])  # fmt: skip
    assert result.size in (1, 2) and "not cached" in result.describe()


GENERATED = ("model=bert_tiny", "data=generated", "model.config.num_hidden_layers=1",
             "model.config.hidden_size=32", "model.config.num_attention_heads=2",
             "model.config.intermediate_size=64", "data.vocab_size=512",
             "phase.max_seq_length=32", "phase.max_predictions_per_seq=5",
             "phase.global_batch_size=16", "data.num_workers=0")  # fmt: skip


def test_without_a_micro_batch_the_plan_takes_the_fastest_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIBERT_CACHE_DIR", str(tmp_path / "cache"))
    config = TrainConfig.of(compose("pretrain", [*GENERATED, "micro_batch_probe=true",
                                                 f"paths.output_root={tmp_path}"]))  # fmt: skip
    batch, _, choice = data_and_batches(config)
    assert choice.probe is not None and batch.micro_batch_size == choice.probe["size"]
    assert [s for s, _ in choice.probe["rates"]] == [4, 16]  # ascending
    assert 16 % batch.micro_batch_size == 0
    assert choice.reason.startswith("the fastest measured (rows/s: 4 → ")
    # why it won, in the plan's words; on a CPU the host's clock times a pass
    assert f"): {choice.probe['why']}" in choice.reason and choice.probe["timing"] == ""
    assert choice.probe["why"].startswith(f"{batch.micro_batch_size} ran ")
    assert "of sizes that fit: the largest that fits" in choice.reason
    off = TrainConfig.of(compose("pretrain", [*GENERATED, "micro_batch_probe=false",
                                              f"paths.output_root={tmp_path}"]))  # fmt: skip
    batch, _, choice = data_and_batches(off)
    assert batch.micro_batch_size == 16 and choice.probe is None
    assert choice.reason.endswith("(not timed: micro_batch_probe=false)")
    monkeypatch.setenv("OMNIBERT_MICRO_BATCH_PROBE", "maybe")
    with pytest.raises(UserError, match=r"OMNIBERT_MICRO_BATCH_PROBE.*'maybe' is not a valid bool"):
        TrainConfig.of(compose("pretrain", list(GENERATED)))


def test_a_resumed_run_keeps_its_checkpoints_micro_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIBERT_CACHE_DIR", str(tmp_path / "cache"))
    common = [*GENERATED, f"paths.output_root={tmp_path}", "run_name=r", "callbacks=minimal",
              "logger=none", "trainer.enable_progress_bar=false",
              "trainer.enable_model_summary=false", "val_every_n_steps=null"]  # fmt: skip
    train(compose("pretrain", [*common, "micro_batch_size=4", "phase.max_steps=1"]), tmp_path / "a")
    resumed = TrainConfig.of(compose("pretrain", [*common, "micro_batch_probe=true",
                                                  "ckpt_path=last", "phase.max_steps=2"]))  # fmt: skip
    batch, _, choice = data_and_batches(resumed)
    assert batch.micro_batch_size == 4 and batch.accumulate_grad_batches == 4
    assert choice.reason.startswith("the micro batch of the checkpoint it resumes")
    assert choice.probe is None


def native(yes: bool) -> Bf16Support:
    flags = {"avx512_bf16": yes, "amx_bf16": yes}
    return Bf16Support(yes, "AVX512" if yes else "AVX2", flags, 0.1, 0.2, "fake flags")


def test_precision_auto_is_bf16_where_the_cpu_has_native_bf16(monkeypatch):
    plugin = CPUPlugin()
    plugin._bf16 = native(True)
    precision, why = plugin.resolve_precision("auto")
    assert precision == "bf16-mixed" and "fake flags" in why and "auto" in why
    plugin._bf16 = native(False)
    precision, why = plugin.resolve_precision("auto")
    assert precision == "32-true" and "no native bf16" in why
    off = CPUPlugin(auto_bf16=False)
    off._bf16 = native(True)
    assert off.resolve_precision("auto")[0] == "32-true"
    assert "accelerator.auto_bf16=false" in off.resolve_precision("auto")[1]
    assert plugin.resolve_precision("32-true") == ("32-true", "set by trainer.precision")
    assert CPUPlugin(auto_bf16="false").auto_bf16 is False  # from OMNIBERT_AUTO_BF16
    with pytest.raises(UserError, match=r"accelerator\.auto_bf16='sometimes' is not true or"):
        CPUPlugin(auto_bf16="sometimes")


def test_compile_auto_compiles_only_a_run_long_enough_to_pay():
    from omnibert.accelerators.base import AcceleratorError
    from omnibert.accelerators.cpu import compile_pays

    auto = CPUPlugin()  # accelerator.compile=auto: conf/accelerator/cpu.yaml's default
    assert auto.compile is False and "not decided" in auto.kernels()["compile"]
    # the demo: 1,000 steps of 32 sequences at ~200/s, 2 layers: minutes, eager
    auto.decide_compile(1000 * 32 / 200, layers=2)
    assert auto.compile is False
    assert auto.kernels()["compile"].startswith("off (eager: compile=auto; the run is projected "
                                                "at 2.7 min eager, under 20x the ~37 s compile")  # fmt: skip
    # the README's command: 3 steps of 65,536 at ~120/s: 27 min, compiled
    auto.decide_compile(3 * 65536 / 120, layers=2)
    assert auto.compile is True and "projected at 27.3 min eager, over 20x" in auto.kernels()[
        "compile"]  # fmt: skip
    compiled, why = compile_pays(30 * 60, layers=12)  # bert-base: ~222 s a compile
    assert compiled is False and "under 20x the ~222 s compile" in why
    assert compile_pays(None, 2)[0] is False  # no probe rate: eager
    off = CPUPlugin(compile=False)
    off.decide_compile(10**6, layers=2)  # an explicit setting stays
    assert off.kernels() == {"compile": "off (eager: accelerator.compile)"}
    on = CPUPlugin(compile=True)
    on.decide_compile(1.0, layers=2)
    assert on.compile is True and on.kernels()["compile"].startswith("torch.compile, mode ")
    with pytest.raises(AcceleratorError, match=r"accelerator\.compile='yes' is not auto, true"):
        CPUPlugin(compile="yes")


def test_the_bf16_rule_reads_the_cpus_flags(monkeypatch):
    from omnibert.accelerators import cpu_bf16

    monkeypatch.setattr(cpu_bf16, "native_bf16_flags", lambda: {"avx512_bf16": False,
                                                                 "amx_bf16": False})  # fmt: skip
    monkeypatch.setattr(cpu_bf16, "cpu_capability", lambda: "AVX2")
    precision, why = CPUPlugin().resolve_precision("auto")
    assert precision == "32-true" and "neither AVX512-BF16 nor AMX-BF16" in why
    monkeypatch.setattr(cpu_bf16, "native_bf16_flags", lambda: {"avx512_bf16": False,
                                                                 "amx_bf16": True})  # fmt: skip
    monkeypatch.setattr(cpu_bf16, "cpu_capability", lambda: "AVX512")
    precision, why = CPUPlugin().resolve_precision("auto")
    assert precision == "bf16-mixed" and "has amx_bf16" in why


def test_a_checkpoint_from_before_the_modern_options_resumes(tmp_path):
    # checkpoints written before BertConfig grew its modern fields hold only BERT's: what
    # they lack counts as the default (make demo resumes its earlier run this way)
    from omnibert.checkpoints.resuming import check_resume_target
    from omnibert.config import TrainConfigError

    old_fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "layer_norm_eps", "initializer_range", "pad_vocab_size_multiple", "attention")  # fmt: skip
    now = TINY.to_dict()
    ckpt = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"model_config": {k: now[k] for k in old_fields}}}, ckpt)
    check_resume_target(str(ckpt), now)  # no refusal
    with pytest.raises(TrainConfigError, match=r"feed_forward='mlp' \(now 'geglu'\)"):
        check_resume_target(str(ckpt), {**now, "feed_forward": "geglu"})
