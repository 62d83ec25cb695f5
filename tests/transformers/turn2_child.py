"""One conversation turn through kvtier.transformers, in this process or as a child process
of test_transformers.py (a new process restoring the prefix another process stored).

    python3 turn2_child.py MODEL_DIR SOCKET TOKENS_JSON OUT_JSON   (also writes OUT_JSON.pt)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "transformers"))

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402

NEW_TOKENS = 8


@torch.no_grad()
def turn(model, client, ids, commit, want_logits=False):
    """Greedy generation of NEW_TOKENS over the cached prefix of `ids` ([1, S]) in an NVFP4
    cache. commit: returns (sequences, blocks committed); else (info, logits [1, new, vocab])."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    cache = kt.prefix_cache(model, client, ids, max_new_tokens=NEW_TOKENS, kv_format="nvfp4", block_tokens=16)
    try:
        r = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                           max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
        if commit:
            return r.sequences, cache.commit(r.sequences)
        info = {"contract": f"{cache.cid:016x}", "hit_blocks": cache.hit_blocks[0], "hit_tiers": cache.hit_tiers[0],
                "tokens": r.sequences[0, ids.shape[1]:].tolist()}
        return info, torch.stack(r.logits, 1).float().cpu()
    finally:
        cache.release()


def main():
    import models
    model_dir, socket, tokens, out = sys.argv[1:5]
    model = kt.use_kvtier(models.load(model_dir))
    client = kvtier.Client(socket, name="turn2-child", has_gpu=True)
    ids = torch.tensor([json.loads(tokens)], dtype=torch.long, device="cuda")
    info, logits = turn(model, client, ids, commit=False, want_logits=True)
    client.close()
    with open(out, "w") as f:
        json.dump(info, f)
    torch.save(logits, out + ".pt")


if __name__ == "__main__":
    main()
