"""The core every engine integration of kvtier shares (vLLM, SGLang, LMCache, transformers).

- :mod:`kvtier.engine.contract`: the contract and identity (shape checks, the one
  model-id rule, the weights' identity, the one validation of scales).
- :mod:`kvtier.engine.keys`: kvtier's key chain over token ids, and an engine's own block
  names hashed into a contract.
- :mod:`kvtier.engine.link`: the daemon link, with the one socket default and the one
  outage policy (misses and recompute, one log line per outage, reconnect with back-off).
- :mod:`kvtier.engine.blockio`: the one chunked save path and the one load path, naming
  the contract for every slot they address.
- :mod:`kvtier.engine.cost`: load or compute: whether a prefix is cheaper to load than to
  compute again, from the engine's own measurements.

Page layouts (how an engine's pages become kvtier blocks) are :mod:`kvtier.pages`'. An
engine module (kvtier.vllm, kvtier.sglang, kvtier.lmcache, kvtier.transformers) holds only
its engine's hooks over these.
"""
from .contract import (AS_IS_FORMATS, DEFAULT_KV_SCALE, QUANTIZED_FROM, TIER_FORMATS, EngineShape,  # noqa: F401
                       UnsupportedEngineModel, engine_contract, folder_identity, kvtier_max_string, layer_scales,
                       load_hf_config, model_id, salt_tag, shape_from_hf_config, tier_scales, weights_identity)
from .keys import block_keys, hashed_key, hashed_keys  # noqa: F401
from .link import DEFAULT_SOCKET, DaemonLink, socket_path  # noqa: F401
from .blockio import ALLOC_WAIT_MS, LOAD_CHUNK, SAVE_CHUNK, BlockIO, slot_view  # noqa: F401
from .cost import LoadCost  # noqa: F401
