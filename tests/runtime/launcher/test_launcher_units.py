"""``sgdsl serve``'s launcher without starting anything: its flags split off the server's
command line, bad data-parallel options refused, GPU slices per replica."""
from __future__ import annotations

import pytest

from sgdsl.runtime.launcher.cli import main, split_argv
from sgdsl.runtime.launcher.replicas import gpu_slices


def test_launcher_flags_are_split_off_the_server_command_line():
    own, rest = split_argv(["--model", "m", "--dp-size", "2", "--api-key", "k", "--tp-size", "2",
                            "--router-policy=round_robin", "--port", "0"])
    assert (own.dp_size, own.router_policy) == (2, "round_robin")
    assert rest == ["--model", "m", "--api-key", "k", "--tp-size", "2", "--port", "0"]
    assert split_argv([])[0].router_policy == "cost_aware"


@pytest.mark.parametrize("argv", [["--dp-size", "0"],
                                  ["--dp-size", "2", "--dist-init-addr", "127.0.0.1:5000"]])
def test_serve_refuses_bad_data_parallel_options(argv, capsys):
    assert main([*argv, "--device", "cpu"]) == 2  # refused before any replica starts
    assert "dp_size" in capsys.readouterr().err


def test_unknown_flags_and_policies_are_refused_before_anything_starts(capsys):
    for argv in (["--dp-size", "2", "--no-such-flag"], ["--router-policy", "nope"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "nope" in capsys.readouterr().err


def test_gpu_slices_leave_cpu_replicas_alone():
    assert gpu_slices(3, 2, "cpu") == [None, None, None]


def test_gpu_slices_give_each_tp_replica_its_own_gpus(monkeypatch):
    import torch

    from sgdsl.runtime.errors import InvalidRequestError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_slices(2, 2, "auto") == ["0,1", "2,3"]
    assert gpu_slices(4, 1, "cuda") == ["0", "1", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_slices(2, 2, "auto") == ["4,5", "6,7"]
    with pytest.raises(InvalidRequestError, match="dp_size x tp_size = 6"):
        gpu_slices(3, 2, "auto")
