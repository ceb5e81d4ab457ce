"""STANDALONE drafting: a smaller model with the target's tokenizer drafts a chain greedily.

The draft model runs in its own ``ModelRunner`` (its own request table and KV pool, sized for
the target's running requests; its own CPU decoder or decode CUDA graphs), on the target's
device and dtype. Per ``propose`` it syncs each request's draft KV with ``req.all_ids``
(``DraftKV``), feeds the missing tokens in one batched forward (an extend, or a decode when
each request misses one token), then ``num_steps - 1`` batched decode forwards, each taking
the argmax. The draft KV of the fed drafts is kept: when the target accepts them, the next
``propose`` only has to feed the token the target added.

``speculative_draft_model_path`` is an HF directory, a ``.gguf`` file (the embedded model's
GGUF maps to the embedded model's converted copy) or a hub id; the target's ``load_format``
applies, so a ``dummy`` target drafts with the same random weights when the path names its
own model (acceptance ~100%, the mechanism's ceiling).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..model.loader import resolve_model_dir
from ..model.model_config import ModelConfig
from ..model.runner import EXTRA_REQ_ROWS, ModelRunner
from .base import EMPTY_TREE, DraftTree, Drafter
from .draft_batch import Feed, build_batch, last_rows
from .draft_kv import DraftEntry, DraftKV
from .draft_memory import kv_bytes_per_token, weight_bytes

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Share of the GPU's memory the draft's KV pool leaves free (both models' activations, graphs).
GPU_MARGIN = 0.05


def resolve_draft_dir(config: EngineConfig) -> Path:
    """HF directory of ``speculative_draft_model_path`` (the loader's rules; the embedded
    model's own GGUF file maps to its existing converted copy instead of a second one)."""
    path = str(config.speculative_draft_model_path)
    p = Path(path).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        from ..model.embedded import embedded_gguf_path, embedded_model_path

        try:
            if p.resolve() == embedded_gguf_path().resolve():
                return embedded_model_path()
        except ModelLoadError:
            pass  # the embedded package is absent: an ordinary GGUF file
    return resolve_model_dir(config.replace(model=path, speculative_algorithm=None,
                                            speculative_draft_model_path=None))


def draft_engine_config(config: EngineConfig, runner: Any, extra_per_req: int) -> EngineConfig:
    """The draft runner's settings: the target's device, dtype and running requests; a
    context no longer than the target's; KV for every slot the target holds plus
    ``extra_per_req`` positions per request row (drafts past the verified tokens)."""
    model_dir = resolve_draft_dir(config)
    draft_cfg = ModelConfig.from_dir(model_dir)
    context = min(runner.context_len, draft_cfg.max_context_len)
    rows = config.max_running_requests + EXTRA_REQ_ROWS
    slots = runner.max_total_tokens + rows * extra_per_req
    if runner.device.type == "cuda":
        slots = min(slots, _gpu_slot_cap(draft_cfg, runner.dtype))
    return config.replace(
        model=str(model_dir), tokenizer=None, speculative_algorithm=None,
        speculative_draft_model_path=None, grammar_backend="none", context_length=context,
        max_total_tokens=slots, device=runner.device.type, dtype=_DTYPE_NAMES[runner.dtype],
        # its own decode CUDA graphs (ModelRunner), unless the speculative ones are off
        disable_cuda_graph=config.disable_cuda_graph or config.speculative_disable_cuda_graph)


def _gpu_slot_cap(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """KV slots the draft may take on the GPU: what its weights leave free, less a margin for
    both models' activations and graphs (the target's runner reserved room for the draft:
    draft_memory.py)."""
    size = torch.empty((), dtype=dtype).element_size()
    free, total = torch.cuda.mem_get_info()
    room = free - weight_bytes(cfg, size) - int(GPU_MARGIN * total)
    return max(room // kv_bytes_per_token(cfg, size), 0)


def forward_cost_ratio(draft: ModelConfig, target: ModelConfig) -> float | None:
    """A lower bound on one draft forward's cost over one target forward at the same batch:
    the smaller of the weight-bytes ratio (what a memory-bound forward reads) and the layer
    ratio (the kernels a launch-bound one issues, one after another). A forward's cost grows
    with both (about ``a * bytes + b * layers``), so a ratio of two costs lies between the two
    ratios; a draft model no smaller than the target in both (itself) gives 1.0. None: the
    two store their weights differently (an fp8 draft of a bf16 target reads half the bytes
    its config says), so the configs bound nothing."""
    if draft.quantization_config != target.quantization_config:
        return None
    size = 2  # the same dtype for both (the draft runs in the target's): the ratio ignores it
    return min(weight_bytes(draft, size) / weight_bytes(target, size),
               draft.num_layers / target.num_layers)


class StandaloneDrafter(Drafter):
    def __init__(self, config: EngineConfig, runner: Any) -> None:
        self.num_steps = config.speculative_num_steps
        self.target_vocab = runner.model_config.vocab_size
        self.target_config = runner.model_config
        self.runner = ModelRunner(draft_engine_config(config, runner, self.num_steps))
        self.kv = DraftKV(self.runner.req_to_token_pool, self.runner.token_kv_pool)
        self.context_len = self.runner.context_len
        self.graph_steps = 0  # draft forwards run as a graph replay (spec_draft_graph_steps)
        logger.info("STANDALONE draft model %s: %d KV slots, %d steps", self.runner.model_dir,
                    self.runner.max_total_tokens, self.num_steps)

    def propose(self, reqs: Sequence[Any], max_tokens: int,
                hidden: Any = None) -> list[DraftTree]:
        steps = min(max_tokens, self.num_steps)
        trees = [EMPTY_TREE] * len(reqs)
        if steps <= 0:
            return trees
        budget = self.kv.kv_pool.available()
        live: list[int] = []
        wants: list[tuple[DraftEntry, list[int]]] = []
        for i, req in enumerate(reqs):
            want, budget = self._sync(req, steps, budget)
            if want is not None:
                live.append(i)
                wants.append(want)
        if not wants:
            return trees
        for i, chain in zip(live, self._draft(wants, steps)):
            trees[i] = DraftTree.chain(chain)
        return trees

    def _sync(self, req: Any, steps: int, budget: int
              ) -> tuple[tuple[DraftEntry, list[int]] | None, int]:
        """The request's entry and the tokens it lacks draft KV for, with the slots of all its
        drafts counted against ``budget``; None: no speculation for it this step."""
        ids = req.all_ids
        n = len(ids)
        if n + steps - 1 > self.context_len:
            self.release(req.rid)
            return None, budget
        entry = self.kv.sync(req.rid, ids, n - 1)  # NOTE: the last token is always fed
        if entry is None:
            return None, budget
        keep = len(entry.ids)
        need = (n - keep) + (steps - 1)
        if need > budget:
            return None, budget
        return (entry, ids[keep:]), budget - need

    def _draft(self, wants: list[tuple[DraftEntry, list[int]]], steps: int) -> list[list[int]]:
        """Greedy chains of ``steps`` tokens: one forward for the missing tokens, then decodes
        (every slot within the budget ``_sync`` counted)."""
        entries = [entry for entry, _ in wants]
        chains: list[list[int]] = [[] for _ in wants]
        for step in range(1, steps + 1):
            starts = [len(entry.ids) for entry in entries]
            slots = self.kv.reserve_many(wants)
            assert slots is not None
            feeds = [Feed(e.row, s, ids, sl) for (e, ids), s, sl in zip(wants, starts, slots)]
            tokens = self._greedy(feeds)
            for chain, tok in zip(chains, tokens):
                chain.append(tok)
            if step == steps:
                break
            wants = [(entry, [tok]) for entry, tok in zip(entries, tokens)]
        return [self._in_vocab(c) for c in chains]

    def _greedy(self, feeds: list[Feed]) -> list[int]:
        batch = build_batch(feeds, self.runner.device)
        graphs = self.runner.cuda_graph_runner
        self.graph_steps += graphs is not None and graphs.can_run(batch)
        logits = self.runner.forward(batch)
        if logits.shape[0] > len(feeds):  # one row per fed token
            logits = logits[last_rows(feeds)]
        return logits.argmax(dim=-1).tolist()

    def _in_vocab(self, chain: list[int]) -> list[int]:
        """A draft vocabulary may be larger (padding rows): cut at the first foreign id."""
        for j, tok in enumerate(chain):
            if tok >= self.target_vocab:
                return chain[:j]
        return chain

    def proposal_cost(self) -> float | None:
        """``num_steps`` draft forwards, each costing at least ``forward_cost_ratio`` of a
        target forward (the draft model drafting for itself: 1.0 each)."""
        ratio = forward_cost_ratio(self.runner.model_config, self.target_config)
        return None if ratio is None else self.num_steps * ratio

    def release(self, rid: str) -> None:
        self.kv.release(rid)

    def check_idle(self) -> list[str]:
        return self.kv.check_idle()
