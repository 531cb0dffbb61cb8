"""On a GPU (skipped without CUDA): every encoding computes on CUDA what it computes on the CPU,
decodes with its cache and with beam search as on the CPU, and takes a bf16-autocast training
step with fused AdamW; a biased attention whose rows sum below float32's range keeps finite
gradients; a run trains compiled on the GPU, resumes and evaluates on the CPU from
the checkpoints the GPU wrote; torchrun's NCCL path trains with one process."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import PE_NAMES, SMOKE, compose, tiny_model, torchrun

from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.encodings.base import sdpa
from posenc.model.layers import DecoderCache
from posenc.model.search import beam_search
from posenc.training.optim import make_optimizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
TRAIN = (*SMOKE, "pe=rope", "trainer.max_steps=6", "trainer.valid_every=3")


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """fp32 matmuls in full precision (no TF32) while a test compares the GPU with the CPU."""
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = allowed


def pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``src (3, 9)`` right-padded to 9, 6 and 3 tokens, and ``tgt (3, 8)``, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (3, 9), generator=generator)
    src[1, 6:] = 0
    src[2, 3:] = 0
    return src, torch.randint(3, 40, (3, 8), generator=generator)


@pytest.mark.parametrize("name", PE_NAMES)
def test_an_encoding_computes_on_cuda_what_it_computes_on_the_cpu(name):
    model = tiny_model(name).eval()
    src, tgt = pair()
    with torch.no_grad():
        expected = model(src, tgt)
        model.to(CUDA)
        got = model(src.to(CUDA), tgt.to(CUDA)).cpu()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", PE_NAMES)
def test_cached_decoding_on_cuda_in_chunks_equals_teacher_forcing(name):
    model = tiny_model(name).eval().to(CUDA)
    src, tgt = (tensor.to(CUDA) for tensor in pair())
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache = DecoderCache()
        spans = ((0, 3), (3, 4), (4, 8))
        chunks = [model.decode(tgt[:, a:b], memory, src_pad, cache) for a, b in spans]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", PE_NAMES)
def test_greedy_and_beam_search_on_cuda_find_the_cpu_translations(name):
    """In float64 on both devices, so that no rounding difference can flip a choice."""
    model = tiny_model(name).double().eval()
    src, _ = pair()
    greedy = model.generate(src, max_len_a=2.0, max_len_b=5)
    beams = beam_search(model, src, 4, 0.6, max_len_a=2.0, max_len_b=5)
    model.to(CUDA)
    assert model.generate(src.to(CUDA), max_len_a=2.0, max_len_b=5) == greedy
    on_gpu = beam_search(model, src.to(CUDA), 4, 0.6, max_len_a=2.0, max_len_b=5)
    for found, expected in zip(on_gpu, beams, strict=True):
        assert [h.tokens for h in found] == [h.tokens for h in expected]
        assert [h.score for h in found] == pytest.approx([h.score for h in expected], rel=1e-9)


@pytest.mark.parametrize("name", PE_NAMES)
def test_a_bf16_autocast_step_with_fused_adamw_on_cuda_is_finite(name):
    model = tiny_model(name).to(CUDA).train()
    optimizer = make_optimizer(model, 1e-3, (0.9, 0.98), 0.01)
    assert optimizer.defaults["fused"]
    src, tgt = (tensor.to(CUDA) for tensor in pair())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.float().transpose(1, 2), tgt[:, 1:], ignore_index=0)
    loss.backward()
    assert torch.isfinite(loss)
    for parameter_name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), parameter_name
    optimizer.step()
    assert all(torch.isfinite(parameter).all() for parameter in model.parameters())


@pytest.mark.parametrize("length", [64, 192, 320])
def test_a_biased_attention_whose_rows_sum_below_float32s_range_has_finite_gradients(length):
    """A bias of -120 on every allowed key (as ALiBi gives a padded encoder row far from all real
    keys) and a key length of 64 modulo 128: cuDNN's masked backward gives NaN query gradients
    there (torch 2.11 on, H100/H200); posenc's attention keeps to the other kernels."""
    shape = (2, 4, length, 64)
    generator = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (
        torch.randn(shape, device=CUDA, generator=generator, dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    future = torch.ones(length, length, dtype=torch.bool, device=CUDA).triu(1)
    bias = torch.full((length, length), -120.0, device=CUDA).masked_fill(future, float("-inf"))
    out = sdpa(q, k, v, bias.to(torch.bfloat16)[None, None], dropout_p=0.0, scale=None)
    out.backward(torch.randn_like(out))
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        assert torch.isfinite(tensor.grad).all(), name


def test_a_compiled_run_on_cuda_resumes_and_evaluates_on_the_cpu(tmp_path, caplog):
    run_dir = tmp_path / "pe=rope"
    run(compose(*TRAIN, "device=cuda", "trainer.compile=true", "eval.enabled=false"), run_dir)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["machine"]["gpu"] and summary["steps"] == 6
    with caplog.at_level("INFO"):
        run(compose(*TRAIN, "device=cpu", "trainer.max_steps=9"), run_dir)
    assert "resumed from" in caplog.text
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 9
    evaluate_main([f"run_dir={run_dir}", "device=cpu", "eval.beam_size=2"])
    assert json.loads((run_dir / "metrics.json").read_text())


def test_torchrun_with_one_process_trains_over_nccl(tmp_path):
    run_dir = tmp_path / "nccl"
    result = torchrun(run_dir, *TRAIN, "device=cuda", "eval.enabled=false", procs=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "process group up: 1 ranks (nccl)" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 6


def test_each_run_in_one_process_records_its_own_gpu_peak(tmp_path):
    """Sweep workers are reused: a small run after a large one in the same process records the
    small one's peak, not the large one's."""
    peaks = {}
    for name, width in (("large", "model.d_model=256"), ("small", "model.d_model=32")):
        run_dir = tmp_path / name
        run(
            compose(*TRAIN, "device=cuda", width, "eval.enabled=false", "trainer.log_every=1"),
            run_dir,
        )
        peaks[name] = json.loads((run_dir / "train_summary.json").read_text())["peak_memory_mb"]
    assert 0 < peaks["small"] < peaks["large"]
