"""Small GLUE and SQuAD data sets in the Hugging Face Hub's layout, from templates over
made-up facts: the columns and feature types of ``nyu-mll/glue`` (each config's
``<config>/<split>-00000-of-00001.parquet`` under a ``README.md`` naming the configs and
their features, as on the Hub) and ``rajpurkar/squad`` (``plain_text/...``), so that
``datasets.load_dataset(<directory>, <config>)`` loads them through the same call as the Hub
names. Labels follow the templates (a model can learn them); test splits carry label -1, as
on the Hub. Deterministic for a seed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from finetune_data import name, squad_file

LABELS = {
    "cola": ["unacceptable", "acceptable"],
    "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"],
    "stsb": None,
    "mnli": ["entailment", "neutral", "contradiction"],
    "ax": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"],
    "wnli": ["not_entailment", "entailment"],
}
COLUMNS = {
    "cola": ["sentence"], "sst2": ["sentence"], "mrpc": ["sentence1", "sentence2"],
    "qqp": ["question1", "question2"], "stsb": ["sentence1", "sentence2"],
    "mnli": ["premise", "hypothesis"], "ax": ["premise", "hypothesis"],
    "qnli": ["question", "sentence"], "rte": ["sentence1", "sentence2"],
    "wnli": ["sentence1", "sentence2"],
}  # fmt: skip
SPLITS = {
    "mnli": ["train", "validation_matched", "validation_mismatched", "test_matched",
             "test_mismatched"],
    "ax": ["test"],
}  # fmt: skip
GOOD, BAD = (
    ["wonderful", "moving", "brilliant", "delightful"],
    ["dull", "awful", "clumsy", "boring"],
)


def _row(task: str, rng: random.Random) -> dict[str, Any]:
    """One example of ``task`` whose label follows from its template."""
    country, thing = name(rng, 2) + "ia", name(rng, 2)
    other = name(rng, 2) + "ia"
    if task == "cola":
        ok = rng.random() < 0.6
        words = f"The people of {country} admire {thing}".split()
        if not ok:
            rng.shuffle(words)
        return {"sentence": " ".join(words) + ".", "label": int(ok)}
    if task == "sst2":
        good = rng.random() < 0.5
        word = rng.choice(GOOD if good else BAD)
        return {"sentence": f"the film about {thing} was {word}", "label": int(good)}
    if task in ("mrpc", "qqp", "rte", "wnli", "qnli"):
        same = rng.random() < 0.5
        first = f"The capital of {country} is {thing}."
        second = f"{thing} is the capital city of {country if same else other}."
        positive = {"mrpc": 1, "qqp": 1, "rte": 0, "qnli": 0, "wnli": 1}[task]
        label = positive if same else 1 - positive
        if task == "qqp":
            return {"question1": f"What is the capital of {country}?",
                    "question2": f"Which city is the capital of {country if same else other}?",
                    "label": label}  # fmt: skip
        if task == "qnli":
            return {"question": f"What is the capital of {country}?",
                    "sentence": second, "label": label}  # fmt: skip
        return {"sentence1": first, "sentence2": second, "label": label}
    if task == "stsb":
        shared = rng.randint(0, 5)
        words = [name(rng, 1) for _ in range(5)]
        second = words[:shared] + [name(rng, 1) for _ in range(5 - shared)]
        return {"sentence1": " ".join(words), "sentence2": " ".join(second),
                "label": float(shared)}  # fmt: skip
    # mnli / ax
    label = rng.randint(0, 2)
    hyp = [f"{thing} is in {country}.", f"{thing} is old.", f"{thing} is not in {country}."]
    return {"premise": f"{thing} is a city in {country}.", "hypothesis": hyp[label],
            "label": label}  # fmt: skip


def _quiet() -> None:
    import datasets

    datasets.disable_progress_bars()  # to_parquet's bar, in every test's output otherwise


def _features(task: str) -> Any:
    import datasets

    feats: dict[str, Any] = {c: datasets.Value("string") for c in COLUMNS[task]}
    labels = LABELS[task]
    feats["label"] = (
        datasets.Value("float32") if labels is None else datasets.ClassLabel(names=labels)
    )
    feats["idx"] = datasets.Value("int32")
    return datasets.Features(feats)


def _readme_features(task: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": c, "dtype": "string"} for c in COLUMNS[task]]
    labels = LABELS[task]
    if labels is None:
        out.append({"name": "label", "dtype": "float32"})
    else:
        names = {str(i): n for i, n in enumerate(labels)}
        out.append({"name": "label", "dtype": {"class_label": {"names": names}}})
    out.append({"name": "idx", "dtype": "int32"})
    return out


def glue_split(task: str, examples: int, seed: int, labelled: bool = True) -> Any:
    """A ``datasets.Dataset`` of ``task`` with the Hub's columns and features."""
    import datasets

    rng = random.Random(f"{task}-{seed}")
    rows = [_row(task, rng) for _ in range(examples)]
    columns: dict[str, list[Any]] = {k: [r[k] for r in rows] for k in rows[0]}
    if not labelled:
        columns["label"] = [-1.0 if LABELS[task] is None else -1] * examples
    columns["idx"] = list(range(examples))
    return datasets.Dataset.from_dict(columns, features=_features(task))


def _yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer (JSON scalars are YAML) for the README's front matter."""
    pad = " " * indent
    if isinstance(value, dict):
        return "".join(
            f"{pad}{k}:\n{_yaml(v, indent + 2)}" if isinstance(v, (dict, list))
            else f"{pad}{k}: {json.dumps(v)}\n"
            for k, v in value.items()
        )  # fmt: skip
    lines = ""
    for item in value:
        body = _yaml(item, indent + 2)
        lines += f"{pad}- {body.lstrip()}"
    return lines


def hub_glue_dir(root: Path, tasks: list[str], train: int = 24, evaluation: int = 12,
                 test: int = 6, seed: int = 0) -> Path:  # fmt: skip
    """``root`` in ``nyu-mll/glue``'s layout with the configs ``tasks``."""
    _quiet()
    configs, infos = [], []
    for task in tasks:
        splits = SPLITS.get(task, ["train", "validation", "test"])
        files = []
        for split in splits:
            size = train if split == "train" else test if split.startswith("test") else evaluation
            ds = glue_split(task, size, seed + len(files), labelled=not split.startswith("test"))
            path = root / task / f"{split}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(path))
            files.append({"split": split, "path": f"{task}/{split}-*"})
        configs.append({"config_name": task, "data_files": files})
        infos.append({"config_name": task, "features": _readme_features(task)})
    front = _yaml({"configs": configs, "dataset_info": infos})
    (root / "README.md").write_text(f"---\n{front}---\n# GLUE fixture\n")
    return root


def hub_squad_dir(root: Path, train: int = 20, evaluation: int = 8, seed: int = 1,
                  version_2: bool = False) -> Path:  # fmt: skip
    """``root`` in ``rajpurkar/squad``'s layout (config ``plain_text``), or with ``version_2``
    ``rajpurkar/squad_v2``'s (config ``squad_v2``; one unanswerable question per context,
    its ``answers`` empty)."""
    import datasets

    _quiet()

    from omnibert.finetune.squad_examples import squad_json_columns

    features = datasets.Features({
        "id": datasets.Value("string"), "title": datasets.Value("string"),
        "context": datasets.Value("string"), "question": datasets.Value("string"),
        "answers": datasets.Sequence({"text": datasets.Value("string"),
                                      "answer_start": datasets.Value("int32")}),
    })  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    config = "squad_v2" if version_2 else "plain_text"
    files = []
    for split, count, offset in (("train", train, 0), ("validation", evaluation, 1)):
        raw = squad_file(root / f"{split}.json", count, seed=seed + offset, facts=2,
                         unanswerable=int(version_2))  # fmt: skip
        data = json.loads(raw.read_text())["data"]
        raw.unlink()
        ds = datasets.Dataset.from_dict(squad_json_columns(data), features=features)
        path = root / config / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(path))
        files.append({"split": split, "path": f"{config}/{split}-*"})
    front = _yaml({"configs": [{"config_name": config, "data_files": files}]})
    (root / "README.md").write_text(f"---\n{front}---\n# SQuAD fixture\n")
    return root
