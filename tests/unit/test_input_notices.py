"""Lines that say an input or a plan is not what the defaults expect: omnibert-prepare warns
when a text file looks hard-wrapped (a licence, not one sentence per line: the heuristic of
omnibert.prepare.text_layout), and omnibert-finetune notes a plan of very few optimiser
steps, naming task.epochs and task.batch_size."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from finetune_data import mrpc_file

from omnibert.apps import prepare as prepare_app
from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig
from omnibert.config.finetune import Recipe
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.prepare.text_layout import layout_of, wrap_report, wrapped_warning
from omnibert.run.finetuning.job import FEW_STEPS, few_steps_notice

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"

#: the head of the Apache License 2.0 (http://www.apache.org/licenses/LICENSE-2.0.txt) as
#: projects ship it: wrapped at about 76 columns, indented, paragraphs between blank lines
APACHE_2_HEAD = """\
                                Apache License
                           Version 2.0, January 2004
                        http://www.apache.org/licenses/

   TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION

   1. Definitions.

      "License" shall mean the terms and conditions for use, reproduction,
      and distribution as defined by Sections 1 through 9 of this document.

      "Licensor" shall mean the copyright owner or entity authorized by
      the copyright owner that is granting the License.

      "Legal Entity" shall mean the union of the acting entity and all
      other entities that control, are controlled by, or are under common
      control with that entity. For the purposes of this definition,
      "control" means (i) the power, direct or indirect, to cause the
      direction or management of such entity, whether by contract or
      otherwise, or (ii) ownership of fifty percent (50%) or more of the
      outstanding shares, or (iii) beneficial ownership of such entity.

      "You" (or "Your") shall mean an individual or Legal Entity
      exercising permissions granted by this License.

      "Source" form shall mean the preferred form for making modifications,
      including but not limited to software source code, documentation
      source, and configuration files.

      "Object" form shall mean any form resulting from mechanical
      transformation or translation of a Source form, including but
      not limited to compiled object code, generated documentation,
      and conversions to other media types.

      "Work" shall mean the work of authorship, whether in Source or
      Object form, made available under the License, as indicated by a
      copyright notice that is included in or attached to the work
      (an example is provided in the Appendix below).

      "Derivative Works" shall mean any work, whether in Source or Object
      form, that is based on (or derived from) the Work and for which the
      editorial revisions, annotations, elaborations, or other modifications
      represent, as a whole, an original work of authorship. For the purposes
      of this License, Derivative Works shall not include works that remain
      separable from, or merely link (or bind by name) to the interfaces of,
      the Work and Derivative Works thereof.

      "Contribution" shall mean any work of authorship, including
      the original version of the Work and any modifications or additions
      to that Work or Derivative Works thereof, that is intentionally
      submitted to Licensor for inclusion in the Work by the copyright owner
      or by an individual or Legal Entity authorized to submit on behalf of
      the copyright owner. For the purposes of this definition, "submitted"
      means any form of electronic, verbal, or written communication sent
      to the Licensor or its representatives, including but not limited to
      communication on electronic mailing lists, source code control systems,
      and issue tracking systems that are managed by, or on behalf of, the
      Licensor for the purpose of discussing and improving the Work, but
      excluding communication that is conspicuously marked or otherwise
      designated in writing by the copyright owner as "Not a Contribution."

      "Contributor" shall mean Licensor and any individual or Legal Entity
      on behalf of whom a Contribution has been received by Licensor and
      subsequently incorporated within the Work.

   2. Grant of Copyright License. Subject to the terms and conditions of
      this License, each Contributor hereby grants to You a perpetual,
      worldwide, non-exclusive, no-charge, royalty-free, irrevocable
      copyright license to reproduce, prepare Derivative Works of,
      publicly display, publicly perform, sublicense, and distribute the
      Work and such Derivative Works in Source or Object form.

   3. Grant of Patent License. Subject to the terms and conditions of
      this License, each Contributor hereby grants to You a perpetual,
      worldwide, non-exclusive, no-charge, royalty-free, irrevocable
      (except as stated in this section) patent license to make, have made,
      use, offer to sell, sell, import, and otherwise transfer the Work,
      where such license applies only to those patent claims licensable
      by such Contributor that are necessarily infringed by their
      Contribution(s) alone or by combination of their Contribution(s)
      with the Work to which such Contribution(s) was submitted. If You
      institute patent litigation against any entity (including a
      cross-claim or counterclaim in a lawsuit) alleging that the Work
      or a Contribution incorporated within the Work constitutes direct
      or contributory patent infringement, then any patent licenses
      granted to You under this License for that Work shall terminate
      as of the date such litigation is filed.
"""

#: one sentence per line, a blank line between documents; headings and a list without
#: full stops among them
SENTENCES = """\
The quick brown fox jumps over the lazy dog.
It was the first sentence anyone typed on the new keyboard, and it used every letter.
Typists liked it.
Contents
The second paragraph of this document goes on for quite a while, well beyond the width at which an editor would wrap a line, because sentences are as long as they need to be.
Short ones follow.
Some end with a question?
Others exclaim!
A list without punctuation
apples and pears
the long road home through the valley of the river and over the two hills beyond it

A new document starts here, after the blank line.
It keeps one sentence per line, as the reference generator reads its input.
Then a sentence of middling length that ends with a colon:
and a line that continues it; then one more sentence to end the paragraph.
Numbers such as 3.14 do not confuse it.
Quotes close some sentences: "like this."
Brackets close others (like this one).
Lines may be very short.
Or long enough to fill most of a terminal window without being wrapped by anyone at all, since nothing wraps them here.
An ellipsis ends this one…
Twenty lines make a fair sample.
The last line of the document.
"""


def test_a_hard_wrapped_licence_is_recognised_and_sentences_are_not(tmp_path):
    licence = tmp_path / "LICENSE"
    licence.write_text(APACHE_2_HEAD)
    report = wrap_report(licence)
    assert report.hard_wrapped and 70 <= report.width <= 80, report
    assert report.fraction > 0.9  # every line of a paragraph but its last
    sentences = tmp_path / "sentences.txt"
    sentences.write_text(SENTENCES)
    for path in (sentences, REFERENCE / "wiki_like.txt", REFERENCE / "single_doc.txt"):
        report = wrap_report(path)
        assert not report.hard_wrapped and report.wrapped_lines <= 1, (path, report)
    # too little to judge: a few wrapped lines are no evidence
    assert not layout_of(APACHE_2_HEAD.splitlines()[:12]).hard_wrapped
    # the same words one sentence per line: no warning
    joined = " ".join(APACHE_2_HEAD.split())
    resplit = joined.replace(". ", ".\n").replace("; ", ";\n")
    assert not layout_of(resplit.splitlines()).hard_wrapped
    warning = wrapped_warning([sentences, licence])
    assert warning is not None and warning.startswith(f"input file {licence} looks hard-wrapped")
    assert "\n" not in warning and "one sentence per line" in warning
    assert wrapped_warning([sentences]) is None


def test_omnibert_prepare_warns_and_still_prepares(tmp_path, bert_vocab_file, caplog, capsys):
    licence = tmp_path / "LICENSE"
    licence.write_text(APACHE_2_HEAD)

    def prepare(text: Path, out: str) -> None:
        cfg = compose("prepare", [f"input_files=[{text}]", f"vocab_file={bert_vocab_file}",
                                  f"output_dir={tmp_path / out}", "max_seq_length=32",
                                  "max_predictions_per_seq=5", "dupe_factor=1",
                                  "progress=false"])  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="omnibert.apps.prepare"):
            prepare_app.run(cfg)

    prepare(licence, "out")
    warnings = [r.getMessage() for r in caplog.records if r.name == "omnibert.apps.prepare"]
    assert len(warnings) == 1 and "looks hard-wrapped" in warnings[0], warnings
    assert "documents" in capsys.readouterr().out  # a warning, not a refusal
    caplog.clear()
    sentences = tmp_path / "sentences.txt"
    sentences.write_text(SENTENCES)
    prepare(sentences, "out2")
    assert not [r for r in caplog.records if "hard-wrapped" in r.getMessage()]


def test_a_plan_of_few_steps_names_epochs_and_batch_size():
    recipe = Recipe("squad", epochs=2, batch_size=32, eval_batch_size=64, max_seq_length=384)
    note = few_steps_notice(2, recipe, 27)  # the defaults on a 27-question set
    assert note == (
        "omnibert-finetune: note: only 2 optimiser steps (27 training examples, "
        "task.batch_size=32, task.epochs=2), too few to learn much; raise task.epochs or "
        "lower task.batch_size for more steps."
    )
    assert "only 1 optimiser step (" in str(few_steps_notice(1, recipe, 5))
    assert few_steps_notice(FEW_STEPS, recipe, 1000) is None


def test_omnibert_finetune_prints_the_note_with_its_plan(tmp_path, tiny_hf, capsys, monkeypatch):
    """The run as far as its plan (the Trainer is not built): 27 pairs at the task's batch
    of 32 and 3 epochs are 3 steps."""
    from omnibert.run.finetuning import job as finetuning

    class Planned(Exception):
        pass

    def stop(*args, **kwargs):
        raise Planned

    monkeypatch.setattr(finetuning, "build", stop)
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={mrpc_file(tmp_path / 'train.tsv', 27, 1)}",
        f"model.init_from={tiny_hf}", f"paths.output_root={tmp_path / 'runs'}",
        "task.max_seq_length=64", "logger=none",
    ])  # fmt: skip
    with pytest.raises(Planned):
        finetuning.run(FinetuneConfig.of(cfg, FineTuneInputError))
    out = capsys.readouterr().out.splitlines()
    plan = next(i for i, line in enumerate(out) if "steps/epoch" in line)
    assert out[plan + 1] == (
        "omnibert-finetune: note: only 3 optimiser steps (27 training examples, "
        "task.batch_size=32, task.epochs=3), too few to learn much; raise task.epochs or "
        "lower task.batch_size for more steps."
    ), out
