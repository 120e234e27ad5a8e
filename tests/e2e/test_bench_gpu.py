"""``scripts/bench_gpu.py --smoke`` runs end to end (tiny model, CPU, a few steps) so the GPU
benchmark cannot rot while no GPU runs it: the default shape, the ``--lease`` shape with
per-layer compilation, the JSON written after every case and ``--deadline`` skipping a case;
the per-layer compile gives one layer graph reused by every layer (the peak table's tests are
in test_throughput.py, where the table now lives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_gpu.py"
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
    assert "ratio omnibert/hf on the same sequences (median of rounds)" in done.stdout
    assert "profile omnibert: operators, own host time" in done.stdout
    results = json.loads(out.read_text())
    assert results["status"] == "done" and results["compile_scope"] == "model"
    assert results["skipped"] == [] and results["failed"] == [] and results["pending"] == []
    cases = {case["packing"]: case for case in results["cases"]}
    assert set(cases) == {"none", "online"}
    for case in cases.values():
        assert case["seq"] == 32 and case["device"] == "cpu"
        assert case["precision"] in ("32-true", "bf16-mixed")  # auto: bf16 where native
        assert case["model"] == "tiny" and case["compile"]["scope"] == "off (eager)"
        assert case["kernels"]["optimizer"].startswith("LAMB ")  # omnibert's, for both
        assert case["update"] == "round"
        for name in ("omnibert", "hf"):
            speed = case[name]
            assert speed["sequences_per_sec"] > 0 and speed["real_tokens_per_sec"] > 0
            assert len(speed["rounds_seconds"]) == 2
            assert speed["mfu"] is None and speed["peak_memory_bytes"] is None  # CPU
            assert speed["optimizer_updates_per_round"] == 1  # update per round, both sides
        assert case["ratio_sequences_per_sec"] > 0
        assert case["hf"]["sequences_per_step"] == case["micro_batch"]  # unpacked rows
        # Hugging Face scores every position of its rows, omnibert the masked slots only
        hf_work, our_work = case["hf"]["work"], case["omnibert"]["work"]
        assert hf_work["mlm_positions_scored"] == hf_work["token_rows_through_encoder"]
        assert our_work["mlm_positions_scored"] < our_work["token_rows_through_encoder"]
        assert case["ratio_work_per_sequence"] > 1
        for name in ("omnibert", "hf"):  # --profile: one more pass, the operators' host time
            prof = case[name]["profile"]
            assert prof["what"] == "operators, own host time"
            assert 0 < prof["counted_seconds"] <= prof["wall_seconds"] * 1.05
            assert abs(sum(prof["shares"].values()) - 1) < 0.01 and prof["shares"]["matmul"] > 0
            seconds = [item["seconds"] for item in prof["top"]]
            assert seconds == sorted(seconds, reverse=True) and len(seconds) == 10
    # unpacked: the very same batches on both sides
    unpacked = cases["none"]
    assert unpacked["same_sequences"]["how"] == "the very same batches"
    assert unpacked["hf"]["sequences_per_round"] == unpacked["omnibert"]["sequences_per_round"]
    assert unpacked["omnibert"]["sequences_per_sec_at_histogram_mean"] is None
    # packed: rows hold more than one sequence each; the peer reads exactly those sequences,
    # less a remainder under one of its batches
    packed = cases["online"]
    assert packed["omnibert"]["sequences_per_step"] > packed["micro_batch"]
    left = packed["same_sequences"]["left_over_sequences"]
    assert 0 <= left < packed["micro_batch"]
    assert packed["hf"]["sequences_per_round"] + left == packed["omnibert"]["sequences_per_round"]
    mean = packed["histogram_mean_length"]
    assert mean == 16.5  # uniform lengths 1..32
    at_mean = packed["omnibert"]["sequences_per_sec_at_histogram_mean"]
    assert at_mean == packed["omnibert"]["real_tokens_per_sec"] / mean
    assert "published" not in unpacked  # the published figures are for seq 512
    record = json.loads((tmp_path / "records" / "gpu-tiny-smoke.json").read_text())
    assert [row[0] for row in record["tables"][0]["rows"]] == ["seq 32, none", "seq 32, online"]
    assert record["tables"][0]["columns"][1] == "omnibert real tokens/s"
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
        ("tiny", 32, "online"), ("tiny", 32, "none"), ("tiny", 32, "none"),
    ]  # fmt: skip
    assert cases[0]["length_histogram"].endswith(
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
    # the third case's new models of the second's shapes reuse those graphs
    assert cases[2]["omnibert"]["dynamo"]["frames"] == cases[2]["hf"]["dynamo"]["frames"] == 0
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
              "attention": None, "batch": None, "precision": None, "scope": None,
              "graphs": None, "update": None, "peer": None}  # fmt: skip
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
    from bench_gpu import compile_scoped
    from bench_gpu_sides import HFStep, hf_bert, hf_bert_inputs
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
    theirs = hf_bert(ours).train()
    torch._dynamo.reset()
    counters.clear()
    try:
        graphs = {}
        for name, model, step, data in (
            ("omnibert", ours, ours, inputs),
            ("hf", theirs, HFStep(theirs), hf_bert_inputs(inputs)),
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
    from bench_gpu import Case, micro_batch, parse, parse_cases, setting

    large, packed, ablated = parse_cases(
        "large:512:none:attention=varlen,large:512:online:wiki:batch=64,"
        "large:512:online:wiki:batch=probe:precision=fp8:scope=model:graphs=on:update=micro:peer=none"
    )
    assert (large.attention, large.batch, large.histogram) == ("varlen", None, None)
    assert (packed.attention, packed.batch) == (None, 64)
    assert packed.histogram is not None and packed.histogram.endswith("_512.json")
    assert large.label() == "large seq 512, packing none, attention varlen"
    assert packed.options() == ", batch 64"
    assert ablated.fields() == {"batch": "probe", "precision": "fp8", "scope": "model",
                                "graphs": "on", "update": "micro", "peer": "none"}  # fmt: skip
    args = parse(["--batch", "16"])
    assert (micro_batch(args, packed), micro_batch(args, large)) == (64, 16)
    assert micro_batch(args, ablated) is None  # the plan chooses
    assert micro_batch(parse([]), Case("base", 128, "none")) == 128
    assert setting(args, ablated, "scope") == "model" and setting(args, large, "scope") == "model"
    assert setting(parse(["--lease"]), large, "scope") == "layers"
    assert setting(args, large, "update") == "round" and setting(args, ablated, "update") == "micro"
    for bad, why in (
        ("large:512:none:batch=x", "batch=x is not a positive integer or probe"),
        ("large:512:none:batch=0", "batch=0 is not a positive integer or probe"),
        ("large:512:none:heads=8", "unknown key(s) ['heads']"),
        ("large:512:none:graphs=yes", "graphs=yes is not one of on|off"),
        ("large:512:none:a:b", "more than one histogram"),
    ):
        with pytest.raises(SystemExit, match="after PACKING come a histogram") as refused:
            parse_cases(bad)
        assert why in str(refused.value)


def test_the_profile_sorts_kernel_names_into_kinds():
    from bench_gpu_profile import PROFILE_CATEGORIES

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


def _packed_run(tmp_path, seq=32, model="tiny"):
    """A packed case's prepared run and batches, through the bench's own composition."""
    import bench_gpu

    args = bench_gpu.parse(["--smoke", "--override", "accelerator.threads=1"])
    uniform = tmp_path / "uniform.json"
    uniform.write_text(json.dumps({"counts": [1] * seq}))
    args.length_histogram = str(uniform)
    case = bench_gpu.Case(model, seq, "online")
    prepared = bench_gpu.compose_run(args, case, tmp_path)
    return prepared, bench_gpu.take_batches(prepared, 3)


def test_the_peer_reads_exactly_the_sequences_of_the_packed_rows(tmp_path):
    """Unpacking omnibert's packed rows gives back every sequence: the same tokens, segments,
    masked ids and NSP labels, and omnibert's own model on the unpacked rows scores the same
    masked positions with the same summed loss as on the packed rows (packing changes the
    rows, never the loss)."""
    import torch
    from bench_gpu_sides import split_sequences, unpack_batches

    from omnibert.models import BertForPreTraining

    prepared, packed = _packed_run(tmp_path)
    rows = prepared.plan.batch.micro_batch_size
    sequences = [s for b in packed for s in split_sequences(b)]
    assert len(sequences) == sum(int((b["nsp_weights"] > 0).sum()) for b in packed)
    assert sum(s["input_ids"].numel() for s in sequences) == sum(
        int((b["sequence_ids"] > 0).sum()) for b in packed
    )
    assert sum(s["masked_lm_ids"].numel() for s in sequences) == sum(
        int((b["masked_lm_weights"] > 0).sum()) for b in packed
    )
    unpacked, left = unpack_batches(packed, rows, 32, 76, torch.device("cpu"))
    assert len(unpacked) == (len(sequences) - left) // rows and 0 <= left < rows
    kept = sequences[: len(sequences) - left]
    for i, item in enumerate(kept):  # row i of the unpacked batches is sequence i
        batch, row = unpacked[i // rows], i % rows
        length, masked = item["input_ids"].numel(), item["masked_lm_ids"].numel()
        assert torch.equal(batch["input_ids"][row, :length], item["input_ids"])
        assert int(batch["sequence_ids"][row].sum()) == length
        assert torch.equal(batch["position_ids"][row, :length], torch.arange(length))
        assert torch.equal(batch["masked_lm_ids"][row, :masked], item["masked_lm_ids"])
        assert int(batch["masked_lm_weights"][row].sum()) == masked
        assert batch["nsp_labels"][row, 0] == item["nsp_label"]
    torch.manual_seed(0)
    model = BertForPreTraining(prepared.plan.model).eval()

    def summed(batches):
        loss = correct = count = nsp = 0.0
        with torch.no_grad():
            for b in batches:
                out = model(b)
                loss += float(out["mlm_loss"]) * float(out["mlm_count"])
                correct += float(out["mlm_correct"])
                count += float(out["mlm_count"])
                nsp += float(out["nsp_loss"]) * float(out["nsp_count"])
        return loss, correct, count, nsp

    one_per_batch, none_left = unpack_batches(packed, 1, 32, 76, torch.device("cpu"))
    assert none_left == 0
    ours, theirs = summed(packed), summed(one_per_batch)
    assert ours[2] == theirs[2] and ours[1] == theirs[1]  # the same masked positions, same hits
    assert abs(ours[0] - theirs[0]) <= 1e-4 * ours[0]
    assert abs(ours[3] - theirs[3]) <= 1e-4 * ours[3]


def test_the_work_counts_agree_with_the_step_flops_and_say_what_each_side_skips(tmp_path):
    """Dense omnibert work equals bert_pretraining_flops with the last layer pruned; Hugging
    Face scores every position and runs every row through every layer; varlen runs only the
    real tokens."""
    import dataclasses

    import torch
    from bench_gpu_sides import unpack_batches, work

    from omnibert.callbacks.throughput import bert_pretraining_flops

    prepared, packed = _packed_run(tmp_path)
    config = prepared.plan.model
    b = packed[0]
    rows, seq = b["input_ids"].shape
    preds, slots = b["masked_lm_positions"].shape[1], b["nsp_positions"].shape[1]
    ours = work([b], config, "omnibert", "sdpa")
    assert ours["flops_executed"] == bert_pretraining_flops(config, rows, seq, preds, slots)
    assert ours["mlm_positions_scored"] == rows * preds
    varlen = work([b], config, "omnibert", "varlen")
    real = int((b["sequence_ids"] > 0).sum())
    assert varlen["token_rows_through_encoder"] == real < rows * seq
    assert varlen["flops_executed"] < ours["flops_executed"]
    unpacked, _ = unpack_batches(packed, 4, seq, 76, torch.device("cpu"))
    hf = work(unpacked[:1], config, "hf", "sdpa")
    # Hugging Face's decoder has the real vocab rows, no padding
    hf_config = dataclasses.replace(config, pad_vocab_size_multiple=1)
    assert hf["flops_executed"] == bert_pretraining_flops(
        hf_config, 4, seq, seq, 1, prune_last_layer=False
    )
    assert hf["mlm_positions_scored"] == 4 * seq


def test_the_modernbert_peer_computes_omniberts_maths_on_the_same_sequences(tmp_path):
    """Hugging Face's ModernBertForMaskedLM built by the bench from omnibert's modern_tiny
    weights gives, on the unpacked rows of omnibert's packed rows, the same summed masked-LM
    loss as omnibert's model on the packed rows (fp32, eval): the peer runs the same maths on
    the same sequences."""
    import torch
    from bench_gpu_sides import HFStep, hf_modern_inputs, hf_modernbert, unpack_batches

    from omnibert.models import BertForPreTraining

    prepared, packed = _packed_run(tmp_path, seq=64, model="modern_tiny")
    torch.manual_seed(0)
    ours = BertForPreTraining(prepared.plan.model).eval()
    theirs = HFStep(hf_modernbert(ours)).eval()
    unpacked, left = unpack_batches(packed, 1, 64, 76, torch.device("cpu"))
    assert left == 0
    with torch.no_grad():
        mine = sum(float(o["mlm_loss"]) * float(o["mlm_count"]) for o in map(ours, packed))
        masked = [int((b["masked_lm_weights"] > 0).sum()) for b in unpacked]
        peer = sum(
            float(theirs(hf_modern_inputs(b))["loss"]) * n
            for b, n in zip(unpacked, masked, strict=True)
        )
    assert abs(mine - peer) <= 1e-4 * mine


@pytest.mark.parametrize("lease", ["h100", "h200"])
def test_the_lease_records_read_again_are_what_the_docs_keep(tmp_path, lease):
    """scripts/gpu_reread.py derives the figures the GPU page quotes from the lease's own
    records: the committed record is what it writes from the committed sources today; a file
    killed before its report has no count; LAMB's floor is at the probe's bandwidth."""
    import gpu_reread

    found = gpu_reread.main(["--lease", lease, "--results-dir", str(tmp_path)])
    written = json.loads((tmp_path / f"gpu-{lease}-reread.json").read_text())
    committed = json.loads((gpu_reread.RECORDS / f"gpu-{lease}-reread.json").read_text())
    assert written["measurements"] == committed["measurements"]
    assert written["tables"] == committed["tables"]
    assert found["tests"][0]["files_without_a_count"] == ["test_gpu"]
    lamb = found["lamb"]
    # the probe's CUDA-event bandwidth is higher than the one timed around single copies
    assert lamb["probe_copy_bandwidth_bytes_per_s"] > lamb["own_copy_bandwidth_bytes_per_s"]
    assert lamb["x_floor_at_probe_bandwidth"] > 1.3 > lamb["x_floor_at_own_bandwidth"]
    for case in found["cases"]:
        if case["packing"] != "none":  # the drawn sequences' mean length against the data's
            drawn, mean = case["omnibert_mean_sequence_tokens"], found["histogram_mean_length"]
            at_mean = case["omnibert_sequences_per_sec_at_histogram_mean"]
            assert at_mean / case["omnibert_sequences_per_sec"] == pytest.approx(drawn / mean)
            assert abs(drawn / mean - 1) > 0.03  # the draws were off the data's mean
        else:  # Hugging Face executes more FLOPs a sequence than omnibert
            assert case["flops_per_sequence"]["hf_over_omnibert"] > 1.1
