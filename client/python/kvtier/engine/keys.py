"""Keys: how an engine's blocks are named inside their contract.

Two kinds, one per what the engine hands kvtier:

- :func:`block_keys`: kvtier's key chain over token ids (vLLM, transformers): one key per
  full block, each naming the whole prefix up to its end, the same in every kvtier client
  of the contract.
- :func:`hashed_keys`: an engine's own opaque block names (SGLang's page hashes, LMCache's
  chunk keys) carried as kvtier keys within a contract: ``BLAKE2b-128(contract id LE8 ||
  name)``. The contract id is in every key, so the same name under another contract
  (another model, weights, dtype, layout, rank) is another key.
"""
from __future__ import annotations

import hashlib
from typing import List, Sequence

import kvtier


def block_keys(contract_id: int, tokens: Sequence[int], block_tokens: int) -> kvtier.KeyArray:
    """kvtier's key chain over `tokens`: one key per full block."""
    return kvtier.key_chain_array(contract_id, tokens, block_tokens)


def hashed_key(contract_id: int, name: str) -> kvtier.Key:
    """The kvtier key of one engine-named block within a contract."""
    d = hashlib.blake2b(contract_id.to_bytes(8, "little") + name.encode("utf-8"), digest_size=16).digest()
    return kvtier.Key(int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big"))


def hashed_keys(contract_id: int, names: Sequence[str]) -> List[kvtier.Key]:
    return [hashed_key(contract_id, n) for n in names]
