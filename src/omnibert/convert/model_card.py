"""The model card of an export: ``README.md`` with the Hugging Face Hub's YAML metadata.

The front matter holds what the Hub reads: ``library_name: transformers``, the
``pipeline_tag`` (``fill-mask``, ``question-answering``, ``text-classification``), ``tags``,
``base_model`` (a Hub id, where the run started from a Hub model), ``datasets`` (Hub ids,
where the data came from the Hub) and, where the run recorded an evaluation, ``model-index``
with its metrics. The body says the same for people: the architecture and which heads the
export holds, the data, the metrics and where they come from (file, step, precision), the
training recipe (steps, batch, learning rate, optimiser, schedule, precision) and how to load
it. Every fact comes from the checkpoint and the run's own records; what they do not record
is said to be unknown, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

__all__ = ["Metric", "ModelCard", "hub_id"]

#: a Hub cache directory: ``.../models--<org>--<name>/snapshots/<revision>``
_CACHE = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def hub_id(path: str | None) -> str | None:
    """The Hub id (``org/name``) of a model directory in the Hugging Face cache, else None."""
    if not path:
        return None
    match = _CACHE.search(str(Path(path).resolve()))
    return f"{match.group(1)}/{match.group(2)}" if match else None


@dataclass(frozen=True)
class Metric:
    """One result: its Hub metric ``type`` (accuracy, f1, ...), a readable name, the value."""

    type: str
    name: str
    value: float


@dataclass(frozen=True)
class ModelCard:
    """What the card says (module docstring); :meth:`render` writes it."""

    title: str
    pipeline_tag: str
    architecture: str
    #: sentences about the model: family, sizes, heads kept and dropped, lower-casing
    about: tuple[str, ...]
    usage: str
    source: str
    tags: tuple[str, ...] = ()
    #: what the run started from, as it was given (a path), and its Hub id when it has one
    started_from: str | None = None
    base_model: str | None = None
    datasets: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    metrics: tuple[Metric, ...] = ()
    #: where the metrics come from (file, step, precision), or why there are none
    metrics_note: str = ""
    #: the eval data's name for model-index
    eval_data: str = "held-out data"
    recipe: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def front_matter(self) -> dict[str, object]:
        meta: dict[str, object] = {
            "library_name": "transformers",
            "pipeline_tag": self.pipeline_tag,
            "tags": ["omnibert", *self.tags],
        }
        if self.base_model:
            meta["base_model"] = self.base_model
        if self.datasets:
            meta["datasets"] = list(self.datasets)
        if self.metrics:
            meta["model-index"] = [
                {
                    "name": self.title,
                    "results": [
                        {
                            "task": {"type": self.pipeline_tag},
                            "dataset": {"name": self.eval_data, "type": self.eval_data},
                            "metrics": [
                                {"type": m.type, "name": m.name, "value": round(m.value, 6)}
                                for m in self.metrics
                            ],
                        }
                    ],
                }
            ]
        return meta

    def render(self) -> str:
        """The ``README.md`` text."""
        lines = ["---", yaml.safe_dump(self.front_matter(), sort_keys=False).rstrip(), "---", ""]
        lines += [f"# {self.title}", "", *self.about, ""]
        lines += ["## Use", "", "```python", self.usage.rstrip(), "```", ""]
        lines += ["## Training data", ""]
        if self.started_from:
            base = f" (Hub: `{self.base_model}`)" if self.base_model else ""
            lines += [f"Started from `{self.started_from}`{base}.", ""]
        lines += [f"- {item}" for item in self.data] or ["- not recorded by the run"]
        lines += ["", "## Evaluation", ""]
        if self.metrics:
            lines += ["| metric | value |", "|---|---|"]
            lines += [f"| {m.name} | {m.value:.4f} |" for m in self.metrics]
            lines.append("")
        lines += [self.metrics_note, "", "## Training recipe", ""]
        if self.recipe:
            lines += ["| setting | value |", "|---|---|"]
            lines += [f"| {key} | {value} |" for key, value in self.recipe]
        else:
            lines.append("Not recorded by the checkpoint.")
        lines += ["", f"Exported by omnibert from `{self.source}`.", ""]
        return "\n".join(lines)
