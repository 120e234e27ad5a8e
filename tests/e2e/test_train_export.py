"""A checkpoint written by a real omnibert-train run exports to a Hugging Face directory that
transformers loads with no missing keys and the same predictions as the trained model."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.checkpoints.reading import model_from_pretraining_checkpoint


def test_trained_checkpoint_exports_to_transformers_with_identical_logits(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(128)))  # experiment=smoke: 128 tokens
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}"])
        summary = run_or_exit(train_cfg, tmp_path / "run")
        ckpt = Path(summary["last_checkpoint"])
        out = tmp_path / "hf"
        export_cfg = compose(
            "export", [f"ckpt={ckpt}", f"out={out}", f"vocab_file={vocab}", "heads=pretraining"]
        )
        export_app.run(export_cfg)
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 6

    ours, hparams = model_from_pretraining_checkpoint(ckpt)
    ours.eval()
    assert hparams["model_config"]["num_hidden_layers"] == 1
    hf, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    hf.eval()

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 128, (2, 32), generator=generator)
    segments = (torch.arange(32) >= 16).long().expand(2, -1)
    positions = torch.arange(32).expand(2, -1)
    batch = {
        "input_ids": ids,
        "segment_ids": segments,
        "position_ids": positions,
        "sequence_ids": torch.ones_like(ids),
        "masked_lm_positions": positions,  # every position: compare the full logit tensor
        "masked_lm_ids": ids,
        "masked_lm_weights": torch.ones(2, 32),
        "nsp_positions": torch.zeros(2, 1, dtype=torch.long),
        "nsp_labels": torch.zeros(2, 1, dtype=torch.long),
        "nsp_weights": torch.ones(2, 1),
    }
    with torch.no_grad():
        got = ours(batch, return_logits=True)
        want = hf(input_ids=ids, token_type_ids=segments)
    torch.testing.assert_close(
        got["mlm_logits"][..., :128], want.prediction_logits, rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        got["nsp_logits"][:, 0], want.seq_relationship_logits, rtol=1e-5, atol=1e-5
    )
