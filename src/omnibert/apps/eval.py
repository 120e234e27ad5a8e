"""``omnibert-eval``: masked-LM (and, with that head, next-sentence) accuracy of any checkpoint on a prepared eval
set (``conf/eval.yaml``). Wiring only: :func:`omnibert.run.tools.evaluation.evaluate_pretrained`,
then print and write the report (rank 0 alone, when several processes evaluate:
:func:`omnibert.errors.is_rank_zero`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.config import TrainConfigError
from omnibert.config.tools import EvalConfig
from omnibert.errors import exit_on, is_rank_zero
from omnibert.paths import check_writable_file, hydra_output_discarded_when_refused

register()


def run(cfg: DictConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """Evaluate as configured; the report is printed and written as JSON."""
    if cfg.get("out"):  # before the evaluation, not after it
        check_writable_file(str(cfg.out), "out")
    config = EvalConfig.of(cfg, TrainConfigError)  # every range, before torch is imported
    from omnibert.run.tools.evaluation import evaluate_pretrained

    report = evaluate_pretrained(config, output_dir)  # this process's rank is known now
    if not is_rank_zero():  # one voice: rank 0 prints and writes the report
        return report
    paths = [] if output_dir is None else [output_dir / "eval.json"]
    if config.out:
        paths.append(Path(config.out))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    print(_text(report, paths), flush=True)
    return report


def _text(report: dict[str, Any], paths: list[Path]) -> str:
    """The printed report; the next-sentence lines only for a model with that head."""
    step = "" if report["step"] is None else f", step {report['step']:,}"
    nsp = "nsp_accuracy" in report
    lines = [
        f"omnibert-eval: {report['checkpoint']} ({report['checkpoint_kind']}{step}) on "
        f"{report['samples']:,} samples, {report['masked_tokens']:,} masked tokens",
        f"  objective           {report['objective']}",
        f"  precision           {report['precision']} ({report['precision_note']})",
        f"  masked-LM accuracy  {report['mlm_accuracy']:.5f} (majority baseline "
        f"{report['mlm_majority_baseline']:.5f})",
    ]
    if nsp:
        lines.append(
            f"  next-sentence acc.  {report['nsp_accuracy']:.5f} (majority baseline "
            f"{report['nsp_majority_baseline']:.5f})"
        )
        lines.append(
            f"  loss                {report['loss']:.5f} (masked-LM {report['mlm_loss']:.5f}, "
            f"next-sentence {report['nsp_loss']:.5f})"
        )
    else:
        lines.append(f"  loss                {report['loss']:.5f} (masked-LM)")
    lines.append(f"  report              {', '.join(str(p) for p in paths) or '(not written)'}")
    return "\n".join(lines)


def run_or_exit(cfg: DictConfig, output_dir: Path | None) -> dict[str, Any]:
    with exit_on("omnibert-eval"):
        return run(cfg, output_dir)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    with exit_on("omnibert-eval"), hydra_output_discarded_when_refused():
        run(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    preflight("omnibert-eval", "eval", (), output_files=("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
