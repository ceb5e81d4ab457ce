"""Bodies of the SGLang-native routes, with the field names of SGLang's ``GenerateReqInput``.

Every field SGLang's ``/generate`` accepts is accepted here too, in one of three ways: honoured
(prompts, sampling params, logprobs, stream, rid), ignored because it changes nothing about
the answer here (metrics labels, routing hints, priorities: see ``_IGNORED``), or refused with
a 400 naming the field when it asks for a feature this runtime lacks (``_REFUSED``), so that a
request never silently loses something it asked for. Anything else is an unknown field (400).
"""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError

# Accepted and ignored: bookkeeping, routing and scheduling hints of a multi-worker SGLang
# deployment (one worker here), and "return X" flags whose False default is all we answer.
_IGNORED = ("log_metrics", "no_logs", "custom_labels", "conversation_id", "priority",
            "extra_key", "routing_key", "routed_dp_rank", "data_parallel_rank",
            "disagg_prefill_dp_rank", "received_time", "external_trace_header", "modalities",
            "background", "bootstrap_host", "bootstrap_port", "bootstrap_room",
            "bootstrap_pair_key", "decode_tp_size", "require_reasoning", "use_audio_in_video")
# Accepted only when null/false/empty: features this runtime does not have.
_REFUSED = ("input_embeds", "video_data", "audio_data", "session_params", "lora_path",
            "lora_id", "custom_logit_processor", "token_ids_logprob", "return_hidden_states",
            "return_routed_experts", "return_entropy", "return_bytes", "positional_embed_overrides")
_REFUSED_SET = frozenset(_REFUSED)


class GenerateRequest(BaseModel):
    """Body of ``POST /generate``."""

    model_config = ConfigDict(extra="forbid")

    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    sampling_params: Union[dict[str, Any], list[dict[str, Any]], None] = None
    # NOTE: null means "default" for these, as in SGLang (its client may send them as null).
    return_logprob: Union[bool, list[bool], None] = None
    logprob_start_len: Union[int, list[int], None] = None
    top_logprobs_num: Union[int, list[int], None] = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: Union[str, list[str], None] = None
    image_data: Any = None
    # SGLang-only fields (see _IGNORED and _REFUSED).
    log_metrics: Any = None
    no_logs: Any = None
    custom_labels: Any = None
    conversation_id: Any = None
    priority: Any = None
    extra_key: Any = None
    routing_key: Any = None
    routed_dp_rank: Any = None
    data_parallel_rank: Any = None
    disagg_prefill_dp_rank: Any = None
    received_time: Any = None
    external_trace_header: Any = None
    modalities: Any = None
    background: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    bootstrap_pair_key: Any = None
    decode_tp_size: Any = None
    require_reasoning: Any = None
    use_audio_in_video: Any = None
    input_embeds: Any = None
    video_data: Any = None
    audio_data: Any = None
    session_params: Any = None
    lora_path: Any = None
    lora_id: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: Any = None
    return_routed_experts: Any = None
    return_entropy: Any = None
    return_bytes: Any = None
    positional_embed_overrides: Any = None

    def check_refused(self) -> None:
        """400 naming the first field that asks for a feature this runtime lacks."""
        given = self.model_fields_set  # NOTE: a field left out is at its default (None)
        if given.isdisjoint(_REFUSED_SET):
            return
        for name in _REFUSED:
            value = getattr(self, name)
            if value not in (None, False) and value != [] and not _all_null(value):
                raise APIError(400, f"{name} is not supported by this server", param=name)


def _all_null(value: Any) -> bool:
    """Per-prompt lists of nulls/falses (SGLang normalizes batches that way)."""
    return isinstance(value, list) and all(v in (None, False) for v in value)


class ConcatAppendRequest(BaseModel):
    """SGLang's ``RuntimeEndpoint.concatenate_and_append`` body (``fork`` joined with
    ``concate_and_append``)."""
    model_config = ConfigDict(extra="forbid")

    src_rids: list[str] = Field(max_length=4096)
    dst_rid: str


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rid: str = ""
    abort_all: bool = False



class PrecompileRequest(BaseModel):
    """``POST /precompile``: constraints to compile ahead of requests, each an object of the
    sampling-params constraint fields (``{"json_schema": ...}``, ``{"regex": ...}``,
    ``{"ebnf": ...}``)."""

    model_config = ConfigDict(extra="forbid")

    constraints: list[dict[str, Any]]
