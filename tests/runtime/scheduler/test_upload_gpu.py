"""On the GPU: HostUpload's reused pinned buffers never hand a copy still in flight new data.
Uploads are queued behind a long device job (the copies wait for it), each from a buffer
overwritten two uploads later; every result must hold what was uploaded."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.layers.upload import HostUpload

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uploads_behind_a_busy_stream_keep_their_values():
    dev = torch.device("cuda")
    upload = HostUpload(dev, min_elems=8)
    a = torch.randn(2048, 2048, device=dev)
    outs, want = [], []
    for i in range(12):
        for _ in range(4):
            a = a @ a / 2048  # keep the stream busy so the copies queue up
        t = torch.arange(i * 100, i * 100 + 5 + 37 * i, dtype=torch.int64)  # sizes grow
        want.append(t)
        outs.append(upload(t))
    torch.cuda.synchronize()
    for got, ref in zip(outs, want):
        assert torch.equal(got.cpu(), ref)


def test_cpu_upload_is_the_tensor_itself():
    t = torch.arange(4)
    assert HostUpload(torch.device("cpu"))(t) is t
