"""Images on the runtime (vision-language models).

- ``image_io.py`` — image sources (bytes, paths, ``data:`` URLs, http(s) when allowed) to PIL.
- ``processor.py`` — the main-process step: the model's own transformers image processor,
  pixel hashes, the prompt's image tokens padded with hash-derived ids (the radix key), M-RoPE
  positions; ``inputs.py`` — what a request carries (``MmData``) and a batch's view of it
  (``MmBatch``, ``ForwardBatch.mm_inputs``); ``mrope.py`` — Qwen2.5-VL's 3-D positions.
- ``embed.py`` — in the model's forward: run the vision encoder on the images a prefill batch
  needs (``EncoderCache``: by pixel hash) and splice the rows into the input embeddings.

Models live in ``runtime/model/`` (``qwen2_5_vl.py`` + ``qwen2_5_vl_vision.py``, ``llava.py``).
"""
