"""scripts/bench_time_to_accuracy.py in its smoke mode, so the benchmark cannot rot: both sides
train bert-tiny a few steps on real prepared shards, at equal sequences per step, and the JSON
holds what the printed lines say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    """`make demo`'s layout (train/, eval/, vocab.txt) from the reference fixture texts.

    Its vocab.txt is the uncased BERT vocab's entries that the two texts use, with the special
    tokens, in the vocab's order: WordPiece's greedy longest match finds the same pieces in it,
    and Hugging Face's logits over the whole vocabulary (its side of the smoke run) cost the
    fraction of BERT's that this vocabulary's size is."""
    out = tmp_path_factory.mktemp("demo")
    texts = [REFERENCE / "wiki_like.txt", REFERENCE / "tiny_docs.txt"]
    bert = Vocab.from_file(bert_vocab_file)
    tokenizer = BertTokenizer(bert, do_lower_case=True)
    lines = [line.strip() for text in texts for line in text.read_text("utf-8").splitlines()]
    used = {i for ids in tokenizer.tokenize_lines(lines) for i in ids}
    specials = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    words = [w for i, w in enumerate(bert.id_to_token()) if i in used or w in specials]
    (out / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    settings = InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    prepare([str(texts[0])], out / "vocab.txt", out / "train", settings, progress=False)
    prepare([str(texts[1])], out / "vocab.txt", out / "eval",
            InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1),
            progress=False)  # fmt: skip
    return out


def test_smoke_runs_both_sides_at_equal_sequences_per_step(demo_like, tmp_path):
    out = tmp_path / "results" / "time_to_accuracy.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_time_to_accuracy.py"), "--smoke",
         "--data", str(demo_like), "--results-dir", str(out.parent), "--batch", "16", "--threads", "1"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "batch: 16 sequences a step on both sides" in proc.stdout
    report = json.loads(out.read_text())["measurements"]
    assert (out.parent / "time_to_accuracy.svg").read_text().startswith("<?xml")
    assert report["batch_unit"] == "sequences" and report["batch"] == 16
    (size,) = report["sizes"]
    assert size["size"] == "tiny"
    ours, theirs = size["omnibert"]["rounds"][0], size["huggingface"]["rounds"][0]
    # packed rows hold several sequences: fewer rows, about the peer's 16 sequences a step
    assert ours["rows_per_step"] < 16
    per_row = ours["sequences_per_step"] / ours["rows_per_step"]
    assert abs(ours["sequences_per_step"] - 16) <= per_row / 2 + 1e-6
    assert theirs["rows_per_step"] == theirs["sequences_per_step"] == 16
    # smoke mode evaluates at step 8 against a 1e-6 target: a side that got any token right
    # stops there, one that did not runs its 12 steps and reports its best evaluation
    for name, side in (("omnibert", ours), ("huggingface", theirs)):
        assert side["curve"], name
        accuracies = [point[3] for point in side["curve"]]
        if side["seconds"] is not None:
            assert accuracies[-1] >= 1e-6 and side["seconds"] > 0
            assert side["seconds"] == pytest.approx(side["curve"][-1][0])
            assert f"{side['seconds']:.1f} s to target" in proc.stdout
        else:
            assert max(accuracies) < 1e-6 and side["steps"] == 12
            assert f"missed the target (best {max(accuracies):.4f}" in proc.stdout
        assert side["samples"] >= report["eval_every"]
    reached = [size[s]["median_seconds"] is not None for s in ("omnibert", "huggingface")]
    if all(reached):
        assert size["ratio"] == pytest.approx(
            size["huggingface"]["median_seconds"] / size["omnibert"]["median_seconds"]
        )
        assert f"omnibert {size['ratio']:.2f}x faster" in proc.stdout
    else:
        assert size["ratio"] is None and "no ratio: omnibert reached the target in" in proc.stdout


def test_medians_ratio_and_misses_are_reported_as_measured():
    import bench_time_to_accuracy as bench

    def run(seconds, samples, steps, accuracies):
        curve = [
            (10.0 * (i + 1), 1600 * (i + 1), 50 * (i + 1), a) for i, a in enumerate(accuracies)
        ]
        return {"seconds": seconds, "samples": samples, "steps": steps, "rows_per_step": 19,
                "sequences_per_step": 32.5, "curve": curve}  # fmt: skip

    size = bench.SIZES["tiny"]
    ours = [run(30.0, 8000, 247, [0.05, 0.11]), run(20.0, 6400, 197, [0.1]),
            run(40.0, 9600, 296, [0.1])]  # fmt: skip
    theirs = [run(100.0, 8000, 250, [0.1]), run(120.0, 8000, 250, [0.1]),
              run(110.0, 8000, 250, [0.1])]  # fmt: skip
    result = bench.summarise("tiny", size, {"omnibert": ours, "huggingface": theirs})
    assert result["omnibert"]["median_seconds"] == 30.0
    assert result["huggingface"]["median_seconds"] == 110.0
    assert result["ratio"] == pytest.approx(110.0 / 30.0)
    assert result["omnibert"]["median_steps"] == 247
    assert "30.0 s to target, 8,000 sequences, 247 steps (19 rows ≈ 32.5" in bench.describe(
        "omnibert", 0, ours[0]
    )
    # one missed round: no median, no ratio, and the miss says how far it got
    missed = run(None, 32000, 1000, [0.04, 0.081, 0.07])
    result = bench.summarise("tiny", size, {"omnibert": [*ours[:2], missed], "huggingface": theirs})
    assert result["omnibert"]["median_seconds"] is None and result["ratio"] is None
    assert result["omnibert"]["reached"] == 2
    assert result["omnibert"]["best"][2] == (0.081, 100)
    assert "missed the target (best 0.0810 at step 100)" in bench.describe("omnibert", 2, missed)


def test_modern_smoke_runs_omnibert_and_modernbert_mlm_only(demo_like, tmp_path, capsys):
    """In-process (the subprocess of the BERT smoke test already covers the command line)."""
    import bench_time_to_accuracy as bench
    import torch

    results = tmp_path / "results"
    threads = torch.get_num_threads()
    try:
        bench.main(["--smoke", "--model", "modern_tiny", "--data", str(demo_like),
                    "--results-dir", str(results), "--batch", "8", "--threads", "1"])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    assert "Hugging Face ModernBertForMaskedLM, attn_implementation=sdpa" in stdout
    # the modern record is its own: the BERT record is not written over
    assert not (results / "time_to_accuracy.json").exists()
    record = json.loads((results / "time_to_accuracy_modern.json").read_text())
    assert "ModernBertForMaskedLM" in record["title"]
    assert record["tables"][0]["rows"][0][0] == "modern-tiny"
    assert (results / "time_to_accuracy_modern.svg").read_text().startswith("<?xml")
    report = record["measurements"]
    (size,) = report["sizes"]
    assert size["size"] == "modern_tiny" and size["recipe"]["preset"] == "modern_tiny"
    ours, theirs = size["omnibert"]["rounds"][0], size["huggingface"]["rounds"][0]
    assert ours["rows_per_step"] < 8 and theirs["rows_per_step"] == 8
    for name, side in (("omnibert", ours), ("huggingface", theirs)):
        assert side["steps"] >= 8 and side["curve"], name  # trained, then evaluated
        assert side["samples"] >= report["eval_every"], name
        for _, _, _, accuracy in side["curve"]:
            assert 0.0 <= accuracy <= 1.0, name
        if side["seconds"] is None:
            assert side["steps"] == 12, name
    for key in ("reached", "median_samples", "median_steps", "best"):
        assert key in size["omnibert"] and key in size["huggingface"]
    assert "ratio" in size


def test_modern_sizes_are_the_presets_and_decay_the_same_parameters():
    import bench_time_to_accuracy as bench
    from omegaconf import OmegaConf

    from omnibert.convert.modernbert import modernbert_parameter_pairs
    from omnibert.optim.param_groups import matches_any

    # what omnibert-train's optimizer=lamb leaves undecayed, on its own parameter names
    ours = list(OmegaConf.load(ROOT / "conf" / "optimizer" / "lamb.yaml").no_weight_decay)
    theirs = bench.NO_WEIGHT_DECAY[True]
    for name, size in bench.MODERN_SIZES.items():
        config = bench.preset_config(name, vocab_size=100)
        assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                config.intermediate_size) == (size.layers, size.hidden, size.heads, size.ffn)  # fmt: skip
        assert not config.next_sentence_head and config.type_vocab_size == 0
        pairs = modernbert_parameter_pairs(config)
        undecayed = [hf for hf, _ in pairs if matches_any(hf, theirs)]
        assert "model.final_norm.weight" in undecayed and "decoder.bias" in undecayed
        assert "model.layers.0.attn.Wqkv.weight" not in undecayed
        for hf, names in pairs:
            for own in names:  # Lamb's rule (re.search) on each side's name of one tensor
                assert matches_any(hf, theirs) == matches_any(own, ours), (hf, own)


def test_modern_hits_weigh_the_masked_positions_in_any_order():
    """Hugging Face's sparse logits come in row-major order of the labelled positions, not in
    the batch's order of masked positions: hits are counted against the right targets, and
    zero-weight slots are not counted."""
    import bench_time_to_accuracy as bench
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, local_attention=8, pad_token_id=0, sparse_prediction=True,
    )  # fmt: skip
    model = transformers.ModernBertForMaskedLM(config).eval()
    ids = torch.randint(5, 40, (3, 12))
    positions = torch.tensor([[7, 2, 9, 0], [3, 9, 5, 0], [1, 8, 4, 6]])
    weights = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    sequence_ids = torch.ones(3, 12, dtype=torch.long)
    sequence_ids[1, 10:] = 0  # row 1 is padded from position 10
    batch = {"input_ids": ids, "sequence_ids": sequence_ids, "masked_lm_positions": positions,
             "masked_lm_weights": weights}  # fmt: skip
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=(sequence_ids > 0).long()).logits
        predicted = full.argmax(-1).gather(1, positions)
    # targets: right where the weight is 1 in a chosen pattern, wrong elsewhere
    right = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1]], dtype=torch.bool)
    batch["masked_lm_ids"] = torch.where(right, predicted, (predicted + 1) % 40)
    with torch.no_grad():
        correct, total = bench.hf_modern_hits(model, batch)
    assert total == 10.0
    assert correct == float((right.float() * weights).sum())  # 7: zero-weight slots ignored


def test_equal_time_sizes_each_run_to_the_minutes_and_evaluates_it_ten_times(demo_like, tmp_path):
    """scripts/bench_equal_time.py end to end for one model at a tiny budget: a probe run, a
    step budget from its rate, the run with its schedule over that budget, the record.
    In-process (the subprocess of the BERT smoke test covers a benchmark's command line)."""
    import bench_equal_time
    import torch

    results = tmp_path / "results"
    threads = torch.get_num_threads()
    try:
        bench_equal_time.main(["--models", "modern_tiny", "--minutes", "0.1", "--probe-steps", "4",
                               "--batch", "16", "--threads", "1", "--data", str(demo_like),
                               "--results-dir", str(results)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    record = json.loads((results / "equal_time.json").read_text())
    (run,) = record["measurements"]["runs"]
    steps = run["recipe"]["max_steps"]
    assert steps % 10 == 0 and run["recipe"]["target"] == 0.999  # no target stops it
    assert run["recipe"]["warmup"] == max(1, round(50 / 1000 * steps))  # modern_tiny's share
    # evaluated along the way and at (within 1 % of) its last step
    assert len(run["curve"]) >= 9 and run["curve"][-1][2] >= 0.99 * steps - 1
    assert record["tables"][0]["rows"][0][0] == "modern-tiny"
    assert float(record["tables"][0]["rows"][0][4]) == pytest.approx(run["accuracy"], abs=1e-4)
    assert (results / "equal_time.svg").read_text().startswith("<?xml")


def test_equal_time_budget_and_probe_arithmetic(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_equal_time import budget_steps, evaluation_seconds, probe_rate

    # 15 min at 100 seq/s, 10 evaluations of 3 s and 20 s of start-up: 850 s of training
    assert budget_steps(100.0, 3.0, 20.0, 15, 32) == 2650  # 2656 down to a multiple of 10
    assert budget_steps(1.0, 3.0, 20.0, 0.1, 32) == 10  # never below one step per evaluation
    # 320 sequences between evaluations 14 s apart, 4 s of them evaluating: 32 seq/s
    assert probe_rate([(5.0, 320, 10, 0.05), (19.0, 640, 20, 0.06)], 4.0) == pytest.approx(32.0)
    with pytest.raises(SystemExit, match="not apart"):
        probe_rate([(5.0, 320, 10, 0.05), (8.0, 640, 20, 0.06)], 4.0)
    log = tmp_path / "mlperf.log"
    log.write_text(
        ':::MLLOG {"key": "eval_start", "time_ms": 1000}\n'
        ':::MLLOG {"key": "eval_stop", "time_ms": 3500}\n'
        ':::MLLOG {"key": "run_stop", "time_ms": 4000}\n'
        ':::MLLOG {"key": "eval_start", "time_ms": 9000}\n'
        ':::MLLOG {"key": "eval_stop", "time_ms": 10500}\n'
    )
    assert evaluation_seconds(log) == pytest.approx([2.5, 1.5])
