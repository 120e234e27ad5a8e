"""``scripts/bench_gpu.py --smoke`` runs end to end (tiny model, CPU, a few steps) so the GPU
benchmark cannot rot while no GPU runs it: the default shape, the ``--lease`` shape with
per-layer compilation, the JSON written after every case and ``--deadline`` skipping a case;
the per-layer compile gives one layer graph reused by every layer; the peak table names the
published devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_gpu.py"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
#: one intra-op thread: a tiny model gains nothing from more, and on a shared CPU waiting for
#: a descheduled OpenMP thread made steps 50x slower
ONE_THREAD = ("--override", "accelerator.threads=1")


def run_script(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *flags, *ONE_THREAD, "--results-dir",
         str(tmp_path / "records")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_bench_gpu_smoke_runs_both_layouts_and_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    done = run_script(tmp_path, "--smoke", "--profile", "--json", str(out))
    assert "ratio omnibert/hf (median of rounds)" in done.stdout
    assert "profile omnibert: operators, own host time" in done.stdout
    results = json.loads(out.read_text())
    assert results["status"] == "done" and results["compile_scope"] == "model"
    assert results["skipped"] == [] and results["failed"] == [] and results["pending"] == []
    cases = {case["packing"]: case for case in results["cases"]}
    assert set(cases) == {"none", "online"}
    for case in cases.values():
        assert case["seq"] == 32 and case["precision"] == "32-true" and case["device"] == "cpu"
        assert case["model"] == "tiny" and case["compile"]["scope"] == "off (eager)"
        assert case["kernels"]["optimizer"].startswith("LAMB ")  # omnibert's, for both
        for name in ("omnibert", "hf"):
            speed = case[name]
            assert speed["sequences_per_sec"] > 0 and speed["real_tokens_per_sec"] > 0
            assert len(speed["rounds_seconds"]) == 2
            assert speed["mfu"] is None and speed["peak_memory_bytes"] is None  # CPU
        assert case["ratio_sequences_per_sec"] > 0
        assert case["hf"]["sequences_per_step"] == case["micro_batch"]  # unpacked rows
        for name in ("omnibert", "hf"):  # --profile: one more pass, the operators' host time
            prof = case[name]["profile"]
            assert prof["what"] == "operators, own host time"
            assert 0 < prof["counted_seconds"] <= prof["wall_seconds"] * 1.05
            assert abs(sum(prof["shares"].values()) - 1) < 0.01 and prof["shares"]["matmul"] > 0
            seconds = [item["seconds"] for item in prof["top"]]
            assert seconds == sorted(seconds, reverse=True) and len(seconds) == 10
    # uniform lengths 5..32: packed rows hold more than one sequence each
    assert cases["online"]["omnibert"]["sequences_per_step"] > cases["online"]["micro_batch"]
    assert cases["none"]["omnibert"]["sequences_per_step"] == cases["none"]["micro_batch"]
    assert "published" not in cases["none"]  # the published figures are for seq 512
    record = json.loads((tmp_path / "records" / "gpu-tiny-smoke.json").read_text())
    assert [row[0] for row in record["tables"][0]["rows"]] == ["seq 32, none", "seq 32, online"]
    assert record["measurements"]["cases"] == results["cases"]


def test_bench_gpu_lease_shape_compiles_per_layer_and_writes_every_case(tmp_path):
    """``--smoke --lease``: the lease's three cases (tiny model, seq 32) in order, each layer
    compiled (dynamo's ``eager`` backend: the tracing, not inductor, for speed)."""
    out = tmp_path / "lease.json"
    backend = "+accelerator.compile_options.backend=eager"
    done = run_script(tmp_path, "--smoke", "--lease", "--compile", "--override", backend,
                      "--json", str(out))  # fmt: skip
    for written in (1, 2, 3):  # the JSON after every case, the report at once
        assert f"bench_gpu: {written} case(s) written to {out}" in done.stdout
    assert done.stdout.count("ratio omnibert/hf") == 3
    results = json.loads(out.read_text())
    assert results["status"] == "done" and results["compile_scope"] == "layers"
    assert results["deadline_seconds"] == 200.0  # the lease's default
    cases = results["cases"]
    assert [(c["model"], c["seq"], c["packing"]) for c in cases] == [
        ("tiny", 32, "none"), ("tiny", 32, "none"), ("tiny", 32, "online"),
    ]  # fmt: skip
    assert cases[2]["length_histogram"].endswith(
        "tests/fixtures/wikipedia_seqlen_histogram_512.json"
    )
    layers = 4  # bench_gpu.MODELS["tiny"]
    for case in cases:
        assert case["compile"]["scope"] == "layers"
        assert case["compile"]["options"] == {"backend": "eager"}
        assert case["rounds"] == 2 and not case["rounds_cut_by_deadline"]
        assert case["omnibert"]["sequences_per_sec"] > 0 and case["hf"]["sequences_per_sec"] > 0
    first = cases[0]
    # one graph for the layers, one for omnibert's last layer (it runs the read rows only);
    # one for HF's: never one per layer
    assert 1 <= first["omnibert"]["dynamo"]["frames"] <= 2 < layers
    assert first["hf"]["dynamo"]["frames"] == 1
    # the second case's new models of the same shapes reuse those graphs
    assert cases[1]["omnibert"]["dynamo"]["frames"] == cases[1]["hf"]["dynamo"]["frames"] == 0
    record = json.loads((tmp_path / "records" / "gpu-tiny-smoke.json").read_text())
    assert (
        len(record["tables"][0]["rows"]) == 3 and "compile layers" in record["tables"][0]["title"]
    )


def test_bench_gpu_writes_each_case_before_the_next_and_skips_past_the_deadline(
    tmp_path, monkeypatch
):
    """``--deadline 0``: the first case runs (nothing to estimate from), the second is skipped
    with the reason, the run ends normally; the JSON holds the first case before the second
    is considered."""
    import bench_gpu
    import torch

    out = tmp_path / "deadline.json"
    seen = []
    estimate = bench_gpu.estimate_seconds

    def spy(args, case, done):
        seen.append(json.loads(out.read_text()))  # what a timeout now would leave
        return estimate(args, case, done)

    monkeypatch.setattr(bench_gpu, "estimate_seconds", spy)
    threads = torch.get_num_threads()
    try:
        results = bench_gpu.main(
            ["--smoke", "--cases", "tiny:32:none,tiny:32:online", "--deadline", "0", "--json",
             str(out), *ONE_THREAD, "--results-dir", str(tmp_path / "records")]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)  # the CPU plugin set this process's
    assert [s["status"] for s in seen] == ["running", "running"]
    assert [len(s["cases"]) for s in seen] == [0, 1]
    online = {"model": "tiny", "seq": 32, "packing": "online", "histogram": None,
              "attention": None, "batch": None}  # fmt: skip
    assert seen[1]["pending"] == [online]  # written with the first case
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(results, default=str))
    assert on_disk["status"] == "done" and on_disk["failed"] == []
    assert [c["packing"] for c in on_disk["cases"]] == ["none"]
    (skipped,) = on_disk["skipped"]
    assert (skipped["model"], skipped["packing"]) == ("tiny", "online")
    assert skipped["reason"].startswith("deadline: ") and "estimate" in skipped["reason"]


def test_layer_scope_compiles_one_graph_that_every_layer_reuses():
    """``compile_scoped(..., "layers")`` on omnibert's and HF's models of 6 layers: dynamo
    compiles the layer's code once (omnibert: once more for its last layer, which has the
    query rows), every graph holds one layer's parameters, none the embeddings or the heads."""
    import torch
    from bench_gpu import HFStep, compile_scoped, hf_batch, hf_model
    from torch._dynamo.utils import counters

    from omnibert.compat import compile_in_place
    from omnibert.models import BertConfig, BertForPreTraining

    layers, batch, seq, preds = 6, 3, 16, 4
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=64)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([[16], [9], [5]])
    inputs = {
        "input_ids": torch.randint(1, 128, (batch, seq), generator=gen),
        "segment_ids": torch.zeros(batch, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(batch, seq).contiguous(),
        "sequence_ids": (torch.arange(seq) < lengths).long(),
        "masked_lm_positions": torch.randint(1, 5, (batch, preds), generator=gen),
        "masked_lm_ids": torch.randint(1, 128, (batch, preds), generator=gen),
        "masked_lm_weights": torch.ones(batch, preds),
        "nsp_positions": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_labels": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_weights": torch.ones(batch, 1),
    }
    torch.manual_seed(0)
    ours = BertForPreTraining(config).train()
    theirs = hf_model(ours).train()
    torch._dynamo.reset()
    counters.clear()
    try:
        graphs = {}
        for name, model, step, data in (
            ("omnibert", ours, ours, inputs),
            ("hf", theirs, HFStep(theirs), hf_batch(inputs)),
        ):
            captured = graphs.setdefault(name, [])

            def backend(gm, example_inputs, captured=captured):
                captured.append(gm)
                return gm.forward

            scope = compile_scoped(
                model, "layers", lambda m: compile_in_place(m, {"backend": backend})
            )
            assert scope.startswith("layers (6 encoder layers")
            for _ in range(2):
                step(data)["loss"].backward()
        assert len(graphs["omnibert"]) == 2 and len(graphs["hf"]) == 1  # not one per layer
        assert counters["frames"]["ok"] == 3 < layers
        for gm in graphs["omnibert"] + graphs["hf"]:
            params = [
                n.name for n in gm.graph.nodes if n.op == "placeholder" and "_parameters_" in n.name
            ]
            assert len(params) == 16  # one layer's: q, k, v, 3 dense, 2 LayerNorms (w, b)
            assert not any("embeddings" in p or "modules_layer_modules" in p for p in params)
    finally:
        torch._dynamo.reset()


def test_a_case_sets_its_attention_and_micro_batch_and_a_bad_one_is_refused():
    from bench_gpu import Case, micro_batch, parse, parse_cases

    large, packed = parse_cases("large:512:none:attention=varlen,large:512:online:wiki:batch=64")
    assert (large.attention, large.batch, large.histogram) == ("varlen", None, None)
    assert (packed.attention, packed.batch) == (None, 64)
    assert packed.histogram is not None and packed.histogram.endswith("_512.json")
    assert large.label() == "BERT-large seq 512, packing none, attention varlen"
    assert packed.options() == ", micro batch 64"
    args = parse(["--batch", "16"])
    assert (micro_batch(args, packed), micro_batch(args, large)) == (64, 16)
    assert micro_batch(parse([]), Case("base", 128, "none")) == 128
    for bad in ("large:512:none:batch=x", "large:512:none:heads=8", "large:512:none:a:b"):
        with pytest.raises(SystemExit, match="after PACKING come a histogram"):
            parse_cases(bad)


def test_the_profile_sorts_kernel_names_into_kinds():
    from bench_gpu import PROFILE_CATEGORIES

    def kind(name: str) -> str:
        return next((k for k, pattern in PROFILE_CATEGORIES if pattern.search(name)), "other")

    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kind("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN") == "matmul"
    assert kind("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>") == "attention"
    assert kind("fmha_cutlassB_bf16_aligned_64x64_k64_sm80") == "attention"
    assert kind("_lamb_apply_kernel") == "optimizer"
    assert kind("triton_red_fused_native_layer_norm_backward_3") == "normalization"
    assert kind("triton_poi_fused_gelu_5") == "elementwise and reductions"
    assert kind("Memcpy DtoD (Device -> Device)") == "copy and fill"
    assert kind("aten::addmm") == "matmul" and kind("aten::add_") == "other"


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table(name, peak):
    from bench_gpu import peak_for_name

    assert peak_for_name(name) == peak
