"""Attention backends (omnibert.models.attention) against the block-diagonal math reference.

Every backend that runs on the CPU computes the reference's maths in fp32 to 1e-5, forward and
gradients, on packed and unpacked rows, with and without all-padding rows; the whole
``BertForPreTraining`` loss and gradients too. The ``gpu``-marked twins run the same checks on
CUDA in bf16 tolerances (deselected where no GPU is); their rows and model also run here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from omnibert.config import TrainConfig
from omnibert.models import BertConfig, BertConfigError, BertForPreTraining
from omnibert.models.attention import DenseAttention, Unpadded
from omnibert.models.attention_choice import AUTO_CHOICES, check_backend, resolve_attention

VOCAB = 99
TINY = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
#: backends that train on the CPU (flex runs forward only there)
CPU_TRAINING = ("sdpa", "varlen")
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def batch_of(packed: bool, padding_rows: bool, seq: int = 24, device: str = "cpu") -> dict:
    """Rows of the data contract: packed rows hold 1-3 sequences (ids 1..K, positions restart,
    one [CLS] NSP slot per sequence), unpacked rows one; padding (id 0) after; the last row
    all padding (every slot weighing 0) when ``padding_rows``."""
    gen = torch.Generator().manual_seed(3 if packed else 4)
    layouts = [[seq], [9, 7, 5], [13], [4, 11]] if packed else [[seq], [17], [6], [20]]
    if padding_rows:
        layouts[-1] = []
    rows, k, p = len(layouts), 3 if packed else 1, 6
    out = {
        "input_ids": torch.zeros(rows, seq, dtype=torch.long),
        "segment_ids": torch.zeros(rows, seq, dtype=torch.long),
        "position_ids": torch.zeros(rows, seq, dtype=torch.long),
        "sequence_ids": torch.zeros(rows, seq, dtype=torch.long),
        "masked_lm_positions": torch.zeros(rows, p, dtype=torch.long),
        "masked_lm_ids": torch.zeros(rows, p, dtype=torch.long),
        "masked_lm_weights": torch.zeros(rows, p),
        "nsp_positions": torch.zeros(rows, k, dtype=torch.long),
        "nsp_labels": torch.randint(0, 2, (rows, k), generator=gen),
        "nsp_weights": torch.zeros(rows, k),
    }
    for row, lengths in enumerate(layouts):
        start, slot = 0, 0
        for number, length in enumerate(lengths):
            span = slice(start, start + length)
            out["input_ids"][row, span] = torch.randint(1, VOCAB, (length,), generator=gen)
            out["segment_ids"][row, start + length // 2 : start + length] = 1
            out["position_ids"][row, span] = torch.arange(length)
            out["sequence_ids"][row, span] = number + 1
            out["nsp_positions"][row, number] = start
            out["nsp_weights"][row, number] = 1.0
            for offset in (1, length - 2)[: p // len(lengths)]:
                out["masked_lm_positions"][row, slot] = start + offset
                out["masked_lm_ids"][row, slot] = int(torch.randint(1, VOCAB, (), generator=gen))
                out["masked_lm_weights"][row, slot] = 1.0
                slot += 1
            start += length
    return {key: value.to(device) for key, value in out.items()}


def model_of(attention: str, config: BertConfig = TINY, device: str = "cpu") -> BertForPreTraining:
    torch.manual_seed(0)
    model = BertForPreTraining(config.replace(attention=attention))
    with torch.no_grad():  # non-zero biases: every parameter matters
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model.to(device)


def loss_and_grads(model: BertForPreTraining, batch: dict) -> tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    out = model(batch, return_logits=True)
    out["loss"].backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def assert_same_pretraining(
    ours: tuple[dict, dict], reference: tuple[dict, dict], tol: dict
) -> None:
    (out, grads), (ref, ref_grads) = ours, reference
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct"):
        torch.testing.assert_close(out[key], ref[key], **tol, msg=key)
    # logits of the slots that count (weight-0 slots may read padding, which varlen skips)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], **tol, msg=name)


def encoder_outputs(backend: str, batch: dict, positions: torch.Tensor | None) -> torch.Tensor:
    model = model_of(backend).eval()
    args = [batch[k] for k in ("input_ids", "segment_ids", "position_ids", "sequence_ids")]
    return model.bert(*args, output_positions=positions)


@pytest.mark.parametrize("padding_rows", [False, True], ids=["full-rows", "padding-rows"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("backend", CPU_TRAINING)
def test_pretraining_loss_and_gradients_equal_the_math_reference(
    backend: str, packed: bool, padding_rows: bool
) -> None:
    batch = batch_of(packed, padding_rows)
    reference = loss_and_grads(model_of("math"), batch)
    ours = loss_and_grads(model_of(backend), batch)
    assert_same_pretraining(ours, reference, FP32)
    assert (
        torch.isfinite(ours[0]["mlm_logits"]).all() and torch.isfinite(ours[0]["nsp_logits"]).all()
    )
    real = batch["masked_lm_weights"] > 0
    torch.testing.assert_close(
        ours[0]["mlm_logits"][real], reference[0]["mlm_logits"][real], **FP32
    )


@pytest.mark.parametrize("padding_rows", [False, True], ids=["full-rows", "padding-rows"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("backend", ["sdpa", "flex", "varlen"])
def test_encoder_forward_equals_the_math_reference(
    backend: str, packed: bool, padding_rows: bool
) -> None:
    """Every position of the full output (fine-tuning heads read them all, padding included),
    and the read rows of the last-layer shortcut at real tokens; flex forward only (CPU)."""
    batch = batch_of(packed, padding_rows)
    with torch.no_grad():
        full, reference = (
            encoder_outputs(backend, batch, None),
            encoder_outputs("math", batch, None),
        )
        torch.testing.assert_close(full, reference, **FP32)
        positions = torch.cat((batch["masked_lm_positions"], batch["nsp_positions"]), dim=1)
        rows = encoder_outputs(backend, batch, positions)
        reference_rows = encoder_outputs("math", batch, positions)
    real = torch.gather(batch["sequence_ids"], 1, positions) > 0
    torch.testing.assert_close(rows[real], reference_rows[real], **FP32)
    if backend == "varlen":  # rows at padding are not computed: zeros, never NaN
        assert torch.all(rows[~real] == 0)


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_attention_gradients_equal_the_math_reference(backend: str) -> None:
    """The attention kernels alone: q/k/v gradients on a packed row with padding."""
    batch = batch_of(packed=True, padding_rows=True)
    ids = batch["sequence_ids"]
    gen = torch.Generator().manual_seed(0)
    heads, dim = 2, 8
    q, k, v = (torch.randn(*ids.shape, heads, dim, generator=gen) for _ in range(3))

    real = ids > 0

    def run(attend: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        """Outputs at real tokens and the q/k/v gradients of a fixed weighting of them."""
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attend(*leaves)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return [out.detach(), *(x.grad for x in leaves if x.grad is not None)]

    def dense(name: str) -> Callable[..., torch.Tensor]:
        attend = DenseAttention.build(name, ids)

        def call(*qkv: torch.Tensor) -> torch.Tensor:  # [B,S,heads,D] <-> [B,heads,S,D]
            return attend(*(x.transpose(1, 2) for x in qkv), 0.0).transpose(1, 2)[real]

        return call

    def varlen(*qkv: torch.Tensor) -> torch.Tensor:
        unpadded = Unpadded.build(ids, None, "sdpa")
        stream = [unpadded.gather(x).transpose(1, 2) for x in qkv]  # [1,heads,T,D]
        out = unpadded.attention(*stream, 0.0).transpose(1, 2).flatten(2)
        return unpadded.scatter(out).view(*ids.shape, heads, dim)[real]

    ours, reference = run(varlen if backend == "varlen" else dense(backend)), run(dense("math"))
    assert len(ours) == len(reference) == 4
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want, **FP32)


def test_varlen_segments_follow_sequence_ids_in_any_order() -> None:
    """Segments are (row, sequence id) groups, so a row whose ids are not in runs still
    attends block-diagonally; the stream holds the real tokens only."""
    ids = torch.tensor([[1, 2, 1, 2, 0, 0], [3, 3, 3, 1, 0, 0]])
    unpadded = Unpadded.build(ids, None, "sdpa")
    assert unpadded.tokens.tolist() == [0, 2, 1, 3, 9, 6, 7, 8]
    assert unpadded.attention.segments.cu_q.tolist() == [0, 2, 4, 5, 8]
    with_padding = Unpadded.build(ids, None, "sdpa", keep_padding=True)
    assert len(with_padding.tokens) == 12


def test_varlen_on_a_batch_of_padding_rows_only_is_the_reference() -> None:
    """No real token at all (eval padding): varlen computes the padding as the reference."""
    batch = batch_of(packed=False, padding_rows=False)
    for key in ("sequence_ids", "masked_lm_weights", "nsp_weights"):
        batch[key] = torch.zeros_like(batch[key])
    with torch.no_grad():
        ours, reference = model_of("varlen")(batch), model_of("math")(batch)
    assert ours["loss"] == reference["loss"] == 0
    positions = torch.cat((batch["masked_lm_positions"], batch["nsp_positions"]), dim=1)
    torch.testing.assert_close(
        encoder_outputs("varlen", batch, positions),
        encoder_outputs("math", batch, positions),
        **FP32,
    )


def test_auto_follows_the_measured_table_and_check_backend_names_the_key() -> None:
    for (device, dropout), bounds in AUTO_CHOICES.items():
        for bound, choice in bounds:
            assert resolve_attention("auto", device, dropout, min(bound, 512)) == choice
    assert resolve_attention("auto", "hpu", True, 128) == "sdpa"  # static graphs elsewhere
    assert resolve_attention("varlen", "cpu", True, 128) == "varlen"
    with pytest.raises(BertConfigError, match="has no attention dropout"):
        check_backend("flex", "cuda", True, backward=True)
    with pytest.raises(BertConfigError, match="no backward pass on the CPU"):
        check_backend("flex", "cpu", False, backward=True)
    with pytest.raises(BertConfigError, match="ipu graphs"):
        check_backend("varlen", "ipu", False, backward=True)
    check_backend("flex", "cpu", False, backward=False)  # CPU inference runs
    with pytest.raises(BertConfigError, match=r"^model.config.attention=flex needs a head size "
                       r"of at least 16 on CUDA, .* is 8 here; use fewer heads"):  # fmt: skip
        check_backend("flex", "cuda", False, backward=True, head_size=8)
    check_backend("flex", "cuda", False, backward=True, head_size=16)


def test_varlen_dropout_trains_and_is_off_in_eval() -> None:
    """With attention dropout, varlen's re-padded kernel drops probabilities in training only."""
    config = TINY.replace(attention_probs_dropout_prob=0.3)
    batch = batch_of(packed=True, padding_rows=True)
    model = model_of("varlen", config).train()
    first, second = model(batch)["loss"], model(batch)["loss"]
    assert not torch.equal(first, second) and torch.isfinite(first)
    model.eval()
    torch.testing.assert_close(
        model(batch)["loss"], model_of("math", config).eval()(batch)["loss"], **FP32
    )


def test_varlen_compiles_with_one_recompile_then_none_as_t_changes() -> None:
    """Under torch.compile the unpadding and the CPU buckets run eagerly between graphs and T is
    dynamic: the second batch adds graphs (automatic dynamic shapes), later batches with other
    token counts none; the compiled losses equal the eager ones."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = model_of("varlen").train()
    compiled = torch.compile(model, backend="eager")
    graphs, tokens = [], []
    for packed, padding_rows in [(False, False), (True, True), (False, True), (True, False)]:
        batch = batch_of(packed, padding_rows)
        out = compiled(batch)
        out["loss"].backward()
        torch.testing.assert_close(out["loss"], model(batch)["loss"], **FP32)
        graphs.append(counters["stats"]["unique_graphs"])
        tokens.append(int((batch["sequence_ids"] > 0).sum()))
    assert len(set(tokens)) == 4  # every batch has another T
    assert graphs[1] == graphs[2] == graphs[3], graphs
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------ CUDA
BF16 = {"rtol": 2e-2, "atol": 2e-2}
#: the CUDA test's rows: phase 1's 128 tokens (the first row fills all of them, so its
#: positions run to 127), and the model those positions need, with heads of 16 (the least
#: FlexAttention takes on CUDA: check_backend)
CUDA_SEQ = 128
CUDA_MODEL = TINY.replace(max_position_embeddings=CUDA_SEQ, num_attention_heads=2)


@pytest.mark.parametrize("padding_rows", [False, True], ids=["full-rows", "padding-rows"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_the_cuda_tests_rows_and_model_run_on_the_cpu(packed: bool, padding_rows: bool) -> None:
    """The inputs and model config of ``test_cuda_bf16_pretraining_equals_the_math_reference``
    (same shapes, same ids) through the CPU path in fp32, so that an id or a position out of
    the model's range fails here (on CUDA it is a device-side assert that poisons the context
    for every later test): math, sdpa and varlen (its CPU buckets) forward and backward, flex
    forward. CUDA-only, checked by the ``gpu`` test alone: bf16 autocast, flex's backward
    (FlexAttention has no backward on the CPU), varlen's flash ``varlen_attn`` kernel (CUDA
    with bf16/fp16 only; on the CPU varlen runs SDPA over length buckets)."""
    batch = batch_of(packed, padding_rows, seq=CUDA_SEQ)
    assert int(batch["position_ids"].max()) < CUDA_MODEL.max_position_embeddings
    assert int(batch["input_ids"].max()) < CUDA_MODEL.vocab_size
    head_size = CUDA_MODEL.hidden_size // CUDA_MODEL.num_attention_heads
    check_backend("flex", "cuda", False, backward=True, head_size=head_size)  # CUDA's flex runs it
    reference = loss_and_grads(model_of("math", CUDA_MODEL), batch)
    for backend in CPU_TRAINING:
        assert_same_pretraining(
            loss_and_grads(model_of(backend, CUDA_MODEL), batch), reference, FP32
        )
    with torch.no_grad():
        flex = model_of("flex", CUDA_MODEL).eval()(batch)
        math = model_of("math", CUDA_MODEL).eval()(batch)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct"):
        torch.testing.assert_close(flex[key], math[key], **FP32, msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("padding_rows", [False, True], ids=["full-rows", "padding-rows"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("backend", ["sdpa", "flex", "varlen"])
def test_cuda_bf16_pretraining_equals_the_math_reference(
    backend: str, packed: bool, padding_rows: bool
) -> None:
    """On CUDA under bf16 autocast (varlen: flash varlen_attn; flex: compiled FlexAttention).
    Its rows and model run on the CPU in test_the_cuda_tests_rows_and_model_run_on_the_cpu."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs a CUDA device")
    batch = batch_of(packed, padding_rows, seq=CUDA_SEQ, device="cuda")
    results = []
    for name in ("math", backend):
        model = model_of(name, CUDA_MODEL, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(loss_and_grads(model, batch))
    assert_same_pretraining(results[1], results[0], BF16)


# ----------------------------------------------------------------------- through the app
SMOKE = ("experiment=smoke", "phase.max_steps=2", "val_every_n_steps=2")


def test_train_app_runs_varlen_and_its_plan_names_the_backend(tmp_path, capsys) -> None:
    from omnibert.apps.compose import compose
    from omnibert.apps.train import run_or_exit

    overrides = [*SMOKE, f"paths.output_root={tmp_path}", "model.config.attention=varlen"]
    summary = run_or_exit(compose("pretrain", overrides), tmp_path / "out")
    assert summary["steps"] == 2 and summary["plan"]["attention"] == "varlen"
    assert 0.0 <= summary["validation"]["val/mlm_acc"] <= 1.0
    printed = capsys.readouterr().out
    assert any(line.split()[:2] == ["attention", "varlen"] for line in printed.splitlines())


def test_auto_is_resolved_in_the_plan_and_flex_on_cpu_is_refused_before_compute(
    tmp_path, capsys
) -> None:
    from omnibert.apps.compose import compose
    from omnibert.apps.train import run_or_exit
    from omnibert.run.pretraining.job import prepare

    auto = prepare(TrainConfig.of(compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}"])))
    train, evaluate = (
        resolve_attention("auto", "cpu", True, 32),
        resolve_attention("auto", "cpu", False, 32),
    )
    assert auto.plan.attention.startswith(
        f"auto: {train} in training, {evaluate} in evaluation (cpu"
    )
    with pytest.raises(SystemExit) as info:
        run_or_exit(
            compose(
                "pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "model.config.attention=flex"]
            ),
            tmp_path / "out",
        )
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.config.attention=flex" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_resumes_and_initialises_under_another_backend(tmp_path) -> None:
    """attention is how the model computes, not what: resume and init_from ignore it."""
    from omnibert.checkpoints.resuming import check_resume_target
    from omnibert.models.config import architecture_diffs

    written = TINY.replace(attention="varlen").to_dict()
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"model_config": written}}, ckpt)
    check_resume_target(str(ckpt), TINY.replace(attention="sdpa").to_dict())
    assert architecture_diffs(written, TINY.to_dict()) == []
    from omnibert.config import TrainConfigError

    with pytest.raises(TrainConfigError, match="hidden_size"):
        check_resume_target(str(ckpt), TINY.replace(hidden_size=64, attention="sdpa").to_dict())
