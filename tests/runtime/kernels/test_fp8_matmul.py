"""FP8 linear kernels on the GPU: the weight-only GEMM (per-channel and block scales, decode and
prefill row counts) and the per-token activation quantizer + ``torch._scaled_mm``, each against
a float64 product of the dequantized operands."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.layers.quantization.fp8_utils import dequantize, quantize_blocks, quantize_rows

from .conftest import ON_GPU, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="fp8 kernels need CUDA")]


@pytest.mark.parametrize("m,split_k", [(1, 1), (1, 4), (7, 2), (300, 1)])
@pytest.mark.parametrize("block", [None, (128, 128)])
def test_weight_only_fp8_matmul(m, split_k, block):
    from sgdsl.runtime.kernels.fp8_matmul import w8a16_matmul

    gen = torch.Generator().manual_seed(m)
    n, k = 384, 640  # not multiples of every tile size
    w = torch.randn(n, k, generator=gen) * 0.05
    q, s = quantize_rows(w) if block is None else quantize_blocks(w, block)
    x = torch.randn(m, k, generator=gen).bfloat16().cuda()
    out = w8a16_matmul(x, q.cuda(), s.cuda(), block, split_k=split_k)
    ref = x.double().cpu() @ dequantize(q, s, block).double().T
    assert out.dtype == torch.bfloat16 and rel_err(out.cpu(), ref) < 1e-2


def test_per_token_quant_and_scaled_mm():
    from sgdsl.runtime.kernels.fp8_matmul import per_token_quant

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 512, generator=gen) * torch.rand(64, 1, generator=gen) * 10).cuda()
    q, s = per_token_quant(x.bfloat16())
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    assert rel_err((q.float() * s).cpu(), x.cpu()) < 4e-2
    w = torch.randn(256, 512, generator=gen) * 0.05
    wq, ws = quantize_rows(w)
    out = torch._scaled_mm(q, wq.cuda().t(), scale_a=s, scale_b=ws.cuda().view(1, -1),
                           out_dtype=torch.bfloat16)
    ref = (q.float() * s).double().cpu() @ dequantize(wq, ws).double().T
    assert rel_err(out.cpu(), ref) < 1e-2


@pytest.mark.parametrize("m", [1, 3, 16])
def test_decode_linear_every_candidate(m, monkeypatch):
    """Whatever the chooser picks, each candidate computes the same product (bf16 and fp8)."""
    from sgdsl.runtime.kernels import decode_gemm

    gen = torch.Generator().manual_seed(m)
    w = (torch.randn(320, 1000, generator=gen) * 0.05)
    x = torch.randn(m, 1000, generator=gen).bfloat16().cuda()
    bias = torch.randn(320, generator=gen).bfloat16().cuda()
    q, s = quantize_rows(w)
    names = decode_gemm._names(x, w.bfloat16().cuda(), None, None)
    if m == 1:
        names += ["gemv", "gemv:4,512,2", "gemv:2,1024,4"]
    for cand in names:
        monkeypatch.setenv("SGDSL_DECODE_GEMM", cand)
        decode_gemm._CHOICE.clear()
        out = decode_gemm.decode_linear(x, w.bfloat16().cuda(), bias)
        ref = x.double().cpu() @ w.bfloat16().double().T + bias.double().cpu()
        assert rel_err(out.cpu(), ref) < 1e-2, cand
        if cand != "cublas":
            out8 = decode_gemm.decode_linear(x, q.cuda(), None, s.cuda())
            assert rel_err(out8.cpu(), x.double().cpu() @ dequantize(q, s).double().T) < 1e-2
    monkeypatch.delenv("SGDSL_DECODE_GEMM")
    decode_gemm._CHOICE.clear()
    decode_gemm.decode_linear(x, w.bfloat16().cuda(), None)
    decode_gemm.decode_linear(x, q.cuda(), None, s.cuda())
    picked = set(decode_gemm.choices().values())
    assert picked == {"gemv"} if m == 1 else picked <= set(names)


def test_decode_gemm_table_overrides_one_row(monkeypatch, tmp_path):
    from sgdsl.runtime.kernels import decode_gemm

    table = tmp_path / "tiles.json"
    table.write_text('{"320,1000,1": "gemv:4,512,2", "320,1000,2": "cublas"}')
    monkeypatch.setenv("SGDSL_DECODE_GEMM_TABLE", str(table))
    decode_gemm._CHOICE.clear()
    x = torch.randn(1, 1000, device="cuda").bfloat16()
    w = torch.randn(320, 1000) * 0.05
    q, s = quantize_rows(w)
    out8 = decode_gemm.decode_linear(x, q.cuda(), None, s.cuda())
    decode_gemm.decode_linear(x, w.bfloat16().cuda(), None)
    assert sorted(decode_gemm.choices().values()) == ["cublas", "gemv:4,512,2"]
    assert rel_err(out8.cpu(), x.double().cpu() @ dequantize(q, s).double().T) < 1e-2
    decode_gemm._CHOICE.clear()


def test_fp32_weights_keep_cublas():
    """An fp32 weight is never given to a Triton GEMM (its fp32 dot is tf32): fp32 runs stay
    exact whatever the timing picks."""
    from sgdsl.runtime.kernels import decode_gemm

    x, w = torch.randn(1, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    assert decode_gemm._names(x, w, None, None) == ["cublas"]
    assert set(decode_gemm._names(x.bfloat16(), w.bfloat16(), None, None)) > {"cublas"}
    decode_gemm._CHOICE.clear()
    torch.testing.assert_close(decode_gemm.decode_linear(x, w, None), x @ w.T, rtol=0, atol=1e-5)
    assert set(decode_gemm.choices().values()) == {"cublas"}
