"""A model family's image tokens in a tokenizer: adding them to a ``tokenizer.json`` (tiny
test models and GPU benchmark directories reuse the embedded SmolLM2 tokenizer) and finding
the placeholder a prompt marks each image with."""
from __future__ import annotations

import json
from pathlib import Path


def add_special_tokens(folder: Path, specials: tuple[str, ...]) -> dict[str, int]:
    """Append ``specials`` to ``folder/tokenizer.json`` as special added tokens (ids after the
    highest id in use) and return their ids."""
    path = Path(folder) / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    added = data["added_tokens"]
    have = {t["content"]: t["id"] for t in added}
    next_id = max([*vocab.values(), *have.values()]) + 1
    for text in specials:
        if text not in have:
            added.append({"id": next_id, "content": text, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
            have[text] = next_id
            next_id += 1
    path.write_text(json.dumps(data))
    return {t: have[t] for t in specials}
