"""Decoder families on kvtier's pages (pytest; ctest runs it through run_tests.py, label
gpu): each family of examples/transformers/models.py FAMILIES, a tiny model written with
save_pretrained and loaded with from_pretrained, on BF16, FP8 and NVFP4 pages, against
three daemons: kvtierd on the shipped config/kvtier.toml (Daemon.shipped, capacities set),
one slot class of the model's block, and slot classes whose granule is
smaller than the block (a block spans several strides of the arena).

Every run is a ragged batch of two rows (48 and 29 prompt tokens, left padded), prefilled
and then teacher-forced over 32 decode steps; logits are compared per row with the same
model under transformers' DynamicCache and sdpa:
- BF16 pages against the model's own sdpa forward: relative L2 <= 2e-2. Pages hold the
  very bf16 K/V sdpa attends to; what differs is the decode kernel's fp32 accumulation
  order and the bf16 rounding of each layer's attention output (2^-9 relative), carried
  through 4 random-weight layers (3.8e-3 to 9.6e-3 measured for five of these families);
  2e-2 is twice the worst.
- FP8 and NVFP4 pages against sdpa whose decode steps attend to the K/V fake-quantized in
  plain torch to the very values the pages hold (tests/transformers/reference.py, same
  scales; the prefill attends to its K/V as computed, as kvtier's does): relative L2 <=
  3e-2. The format's own error is then in both, so what is left is the BF16 bound plus
  the few values that round to a neighbouring code because an earlier layer's K/V differ
  in the last bf16 bit. A cache that quantized the wrong values (the Phi-3 NVFP4 error:
  0.75 against the model, 0.107 for the format) is off by an order of magnitude more.
- FP8 and NVFP4 against the plain sdpa forward are reported (relative L2 and top-1
  agreement), with a sanity bound: at most 2x the fake quantization's own error plus the
  BF16 bound.
Shapes the kernels do not serve (Gemma's head_dim 256 on BF16 and FP8 pages) must be
refused by prefix_cache with the reason, before any slot is allocated; REFUSED_FAMILIES
by use_kvtier.
"""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: kvtier's kernels need one", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "transformers"))

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402
from kvtier import kernels as K  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402
import models  # noqa: E402
import reference as R  # noqa: E402

REPORT = os.environ.get("KVTIER_REPORT_DIR")
BF16_BOUND = 2e-2
QUANT_BOUND = 3e-2
_results = {}


def daemon(kind, model):
    layers, _, kv_heads, head_dim = kt.model_geometry(model)
    block = K.page_bytes(K.BF16, kv_heads, head_dim, kt.DEFAULT_BLOCK_TOKENS) * layers  # the largest format's
    if kind == "shipped":
        return Daemon.shipped({"tiers.hbm.capacity": "1GiB", "tiers.host.capacity": "1GiB",
                               "tiers.nvme.capacity": "2GiB"})
    # The two other geometries test configs other than the shipped one, on purpose: one slot
    # size for every block, and listed classes whose granule is smaller than a block.
    if kind == "one_class":
        return Daemon(slot_bytes=block, slot_classes=[], hbm="1GiB", host="1GiB", nvme="2GiB")
    # Classes of 4 KiB and the block: the granule (the stride of slot ids) is 4 KiB.
    return Daemon(slot_bytes=block, slot_classes=[4096, block], hbm="1GiB", host="1GiB", nvme="2GiB")


def ragged(vocab, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.zeros(len(lengths), S, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, S - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, S - n:] = 1
    return ids.cuda(), mask.cuda()


@torch.no_grad()
def kvtier_logits(model, client, ids, mask, forced, contract):
    cache = kt.prefix_cache(model, client, ids, mask, max_new_tokens=forced.shape[1] + 1, contract=contract)
    try:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = [model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                     use_cache=True).logits[:, -1].float()]
        last = pos[:, -1:]
        for i in range(forced.shape[1]):
            last = last + 1
            out.append(model(input_ids=forced[:, i:i + 1], position_ids=last, past_key_values=cache,
                             use_cache=True).logits[:, -1].float())
        return torch.stack(out, 1)
    finally:
        cache.release()


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {name: models.save_random(models.family_config(name), str(tmp_path_factory.mktemp(name)), seed=3)
            for name in models.FAMILIES}


@pytest.mark.parametrize("family", list(models.FAMILIES))
def test_family(family, family_dirs):
    model = kt.use_kvtier(models.load(family_dirs[family]))
    vocab = model.config.vocab_size
    ids, mask = ragged(vocab, [48, 29], seed=1)
    forced = torch.randint(3, vocab, (2, 32), generator=torch.Generator().manual_seed(2)).cuda()
    ref = R.logits(model, ids, mask, forced)
    contracts, refs, served = {}, {}, {}
    for fmt in kt.FORMATS:
        try:
            kt.check_format(model, fmt, kt.DEFAULT_BLOCK_TOKENS)
        except kt.UnsupportedModel as e:
            served[fmt] = str(e)
            continue
        contracts[fmt] = kt.contract_for(model, fmt)
        refs[fmt] = ref if fmt == "bf16" else R.logits(model, ids, mask, forced, fmt, contracts[fmt].k_scales,
                                                         contracts[fmt].v_scales)
    assert contracts, f"{family}: no page format serves it ({served})"
    for kind in ("shipped", "one_class", "granule_below_block"):
        with daemon(kind, model) as d:
            client = kvtier.Client(d.socket, name=f"{family}-{kind}", has_gpu=True)
            for fmt, why in served.items():
                with pytest.raises(kt.UnsupportedModel, match="unsupported"):
                    kt.prefix_cache(model, client, ids, mask, kv_format=fmt)
                print(f"{family}: {fmt} refused: {why}")
            for fmt, contract in contracts.items():
                got = kvtier_logits(model, client, ids, mask, forced, contract)
                for b in range(ids.shape[0]):
                    vs_model = R.rel_l2(got[b], ref[b])
                    vs_fq = R.rel_l2(got[b], refs[fmt][b])
                    fq = R.rel_l2(refs[fmt][b], ref[b])
                    row = {"rel_l2_vs_sdpa": vs_model, "top1_vs_sdpa": R.top1(got[b], ref[b]),
                           "rel_l2_vs_fakequant": vs_fq, "fakequant_rel_l2": fq,
                           "fakequant_top1": R.top1(refs[fmt][b], ref[b])}
                    _results[f"{family}/{kind}/{fmt}/row{b}"] = row
                    print(f"{family:9s} {kind:20s} {fmt:6s} row {b}: rel L2 vs sdpa {vs_model:.2e} "
                          f"(format alone {fq:.2e}), vs fake-quant {vs_fq:.2e}, top-1 {row['top1_vs_sdpa']:.3f}")
                    if fmt == "bf16":
                        assert vs_model <= BF16_BOUND, f"{family}/{kind} bf16 row {b}: {vs_model:.2e}"
                    else:
                        assert vs_fq <= QUANT_BOUND, f"{family}/{kind} {fmt} row {b}: {vs_fq:.2e} vs fake-quant"
                        assert vs_model <= 2 * fq + BF16_BOUND, \
                            f"{family}/{kind} {fmt} row {b}: {vs_model:.2e} vs sdpa (format alone {fq:.2e})"
            hbm = [s for s in client.stats() if s.tier == "hbm"][0]
            assert hbm.slots_used == 0, f"{family}/{kind}: slots left allocated: {hbm}"
            client.close()
    if REPORT:
        os.makedirs(REPORT, exist_ok=True)
        with open(os.path.join(REPORT, "transformers_families.json"), "w") as f:
            json.dump(_results, f, indent=1)


@pytest.mark.parametrize("family", list(models.REFUSED_FAMILIES))
def test_refused_family(family, tmp_path):
    model = models.load(models.save_random(models.family_config(family), str(tmp_path / family), seed=3),
                        attn_implementation="sdpa")
    with pytest.raises(kt.UnsupportedModel) as e:
        kt.use_kvtier(model)
    print(f"{family} refused: {e.value}")
