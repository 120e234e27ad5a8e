"""``omnibert-prepare``: text (or WikiExtractor output) → reference-exact pretraining shards,
and optionally an offline pack index of them (``pack.enabled=true``).

Wiring only: compose the config, check it, warn when a text input looks hard-wrapped
rather than one sentence per line (:mod:`omnibert.prepare.text_layout`), run
:func:`omnibert.prepare.pipeline.prepare` and
:func:`omnibert.prepare.pack_index.build_pack_index`. With ``pack.enabled=true`` and no
``input_files``, only the existing ``output_dir`` is packed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.config.sections import ConfigError, at_least
from omnibert.data.pack_index import PackIndex, PackIndexError
from omnibert.errors import exit_on
from omnibert.paths import check_writable_dir, hydra_output_discarded_when_refused
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.output_dir import discarded_when_refused
from omnibert.prepare.pack_index import build_pack_index, check_pack_settings
from omnibert.prepare.pipeline import PrepareError, expand_input_files, prepare
from omnibert.prepare.text_layout import wrapped_warning

register()

log = logging.getLogger("omnibert.apps.prepare")


def check_prepare(cfg: DictConfig) -> None:
    """Ranges of ``omnibert-prepare``'s keys (InstanceSettings checks the recipe's own)."""
    from omnibert.prepare.instances import InstanceSettings

    settings = InstanceSettings.from_config(cfg)
    try:
        settings.validate()
    except ValueError as err:
        raise ConfigError(str(err)) from err
    at_least("random_seed", cfg.random_seed, 0)
    at_least("num_workers", cfg.num_workers, 1)
    at_least("eval_samples", cfg.eval_samples, 1)
    at_least("train_vocab.vocab_size", cfg.train_vocab.vocab_size, 6)
    at_least("train_vocab.min_frequency", cfg.train_vocab.min_frequency, 1)
    size = cfg.max_shard_size
    if (
        isinstance(size, bool)
        or not isinstance(size, (int, str))
        or (isinstance(size, int) and size < 1)
    ):
        raise ConfigError(
            f"max_shard_size={size!r} must be a size such as 500MB or a byte count; fix "
            "max_shard_size."
        )


def run(cfg: DictConfig) -> None:
    check_prepare(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if cfg.pack.enabled:
        _check_pack(cfg)
        if "input_files" in missing:  # pack the existing output_dir only
            if "output_dir" in missing:
                raise PackIndexError(
                    "output_dir must be set to pack existing data, e.g. omnibert-prepare "
                    "output_dir=outputs/demo/train pack.enabled=true."
                )
            check_writable_dir(cfg.output_dir, "output_dir")
            _pack(cfg)
            return
    if missing:
        raise PrepareError(
            f"{', '.join(missing)} must be set, e.g. omnibert-prepare input_files=[a.txt] "
            "vocab_file=vocab.txt output_dir=out"
        )
    settings = InstanceSettings.from_config(cfg)
    input_files = (
        OmegaConf.to_object(cfg.input_files)
        if OmegaConf.is_list(cfg.input_files)
        else cfg.input_files
    )
    check_writable_dir(cfg.output_dir, "output_dir")
    if cfg.input_format == "text":  # read as one sentence per line: say when it is not
        warning = wrapped_warning(expand_input_files(input_files))  # type: ignore[arg-type]
        if warning:
            log.warning(warning)
    vocab_file = Path(cfg.vocab_file)
    shortfalls: list[dict[str, Any]] = []  # what was produced short of what was asked
    if not vocab_file.exists() and cfg.train_vocab.enabled:
        check_writable_dir(vocab_file.parent, "vocab_file")
        from omnibert.prepare.vocab_training import train_wordpiece_vocab

        paths = expand_input_files(input_files)  # type: ignore[arg-type]
        log.info(
            "training a %d-token WordPiece vocab on %d files",
            cfg.train_vocab.vocab_size,
            len(paths),
        )
        trained = train_wordpiece_vocab(
            paths,
            vocab_file,
            vocab_size=cfg.train_vocab.vocab_size,
            do_lower_case=cfg.do_lower_case,
            min_frequency=cfg.train_vocab.min_frequency,
        )
        print(f"trained {trained}", flush=True)
        if trained.shortfall is not None:
            shortfalls.append(trained.shortfall)
    with discarded_when_refused(Path(cfg.output_dir)):
        summary = prepare(
            input_files,  # type: ignore[arg-type]
            vocab_file,
            cfg.output_dir,
            settings,
            do_lower_case=cfg.do_lower_case,
            input_format=cfg.input_format,
            num_workers=cfg.num_workers,
            eval_samples=cfg.eval_samples,
            overwrite=cfg.overwrite,
            max_shard_size=cfg.max_shard_size,
            progress=cfg.progress,
            shortfalls=shortfalls,
        )
    print(summary.render())
    if cfg.pack.enabled:
        _pack(cfg)


def _check_pack(cfg: DictConfig) -> None:
    """Bad ``pack.*`` settings stop before any work."""
    check_pack_settings(
        cfg.pack.algorithm,
        cfg.pack.max_sequences_per_pack,
        cfg.pack.max_predictions_per_pack,
        cfg.pack.name,
        OmegaConf.to_container(cfg.pack.options),  # type: ignore[arg-type]
    )


def _pack(cfg: DictConfig) -> PackIndex:
    index = build_pack_index(
        cfg.output_dir,
        algorithm=cfg.pack.algorithm,
        max_sequences_per_pack=cfg.pack.max_sequences_per_pack,
        max_predictions_per_pack=cfg.pack.max_predictions_per_pack,
        seed=cfg.random_seed,
        name=cfg.pack.name,
        overwrite=cfg.pack.overwrite,
        options=OmegaConf.to_container(cfg.pack.options),  # type: ignore[arg-type]
        progress=cfg.progress,
    )
    print(render_pack_summary(index))
    return index


def render_pack_summary(index: PackIndex) -> str:
    """One paragraph: packs, sequences/pack, efficiency before → after, speed-up, P, time."""
    info = index.info
    if info.get("reused"):
        return f"{index.path} already holds this pack index (same data and settings); kept it."
    return (
        f"packed {info['rows']:,} sequences into {info['num_packs']:,} packs of "
        f"{info['max_sequence_length']} tokens ({info['algorithm']}, at most "
        f"{info['max_sequences_per_pack']} per pack) in {info['runtime_s']:.2f} s: "
        f"{info['sequences_per_pack']:.3f} sequences/pack, token efficiency "
        f"{info['efficiency_unpacked']:.1%} -> {info['efficiency']:.1%}, "
        f"{info['speedup']:.2f}x fewer rows; packed batches need "
        f"{info['max_predictions_per_pack']} masked positions per row; wrote {index.path}"
    )


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="prepare")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-prepare"), hydra_output_discarded_when_refused():
        run(cfg)


def main() -> None:
    preflight("omnibert-prepare", "prepare", ("output_dir",), (check_prepare,))
    _hydra_main()


if __name__ == "__main__":
    main()
