"""kvtier.engine and the vLLM connector's copy helpers, against a real kvtierd and vLLM's own
view of its CPU pages (run by tests/vllm/run.sh inside the vLLM venv; ctest vllm_engine_unit).

- the shape and contract: refusals by name (MLA, hybrid/sliding layers, FP16, bad kv_format
  or kv_scale), GQA heads per TP rank, and a different contract id for every change of
  model, weights, layout, rank, block size, salt, tier format or scale;
- the connector's BlockMover (kvtier.pages, kind "cpu"): bit-exact round trips on random
  pages, the block's K and V pages equal what vLLM's CPU attention reads from the same pages
  (its own view code), and NVFP4 mode's bytes are libkvtier's codec's;
- DaemonLink: a daemon that is not there gives None and one warning, a started daemon is
  attached, a stopped one is noticed once, and it is attached again when back;
- a block saved from pages through a real kvtierd's staging slot and loaded back from its
  read-only arena into other pages is bit-exact.
Prints "N passed, N failed"; exit 1 on a failure.
"""
import logging
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import torch  # noqa: E402

import kvtier  # noqa: E402
import kvtier.daemon  # noqa: E402
from kvtier import engine as E  # noqa: E402
from kvtier import pages as P  # noqa: E402

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def raises(fn, words):
    try:
        fn()
    except E.UnsupportedEngineModel as e:
        return all(w in str(e) for w in words), str(e)
    return False, "no error"


LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "hidden_size": 512, "head_dim": 64, "torch_dtype": "bfloat16"}


def test_shapes_and_contracts():
    s = E.shape_from_hf_config(LLAMA, tp_size=2)
    check("KV heads per TP rank", (s.num_layers, s.num_kv_heads, s.head_dim) == (4, 2, 64), s)
    ok, msg = raises(lambda: E.shape_from_hf_config(dict(LLAMA, kv_lora_rank=512)), ["MLA"])
    check("MLA refused by name", ok, msg)
    ok, msg = raises(lambda: E.shape_from_hf_config(dict(LLAMA, layer_types=["full_attention", "sliding_attention"])),
                     ["sliding_attention"])
    check("hybrid layers refused by name", ok, msg)
    ok, msg = raises(lambda: E.shape_from_hf_config(dict(LLAMA, sliding_window=4096)), ["sliding-window"])
    check("sliding window refused", ok, msg)
    s1 = E.shape_from_hf_config(LLAMA)
    ok, msg = raises(lambda: E.engine_contract("vllm", "m", "w", E.EngineShape(4, 4, 64, "float16"), 32),
                     ["float16", "bfloat16"])
    check("FP16 refused with the reason", ok, msg)
    c = E.engine_contract("vllm", "m", "w", s1, 32, tier_format="nvfp4")
    check("NVFP4 tier format: NVFP4 blocks with the default scale 2^-4 in the contract",
          c.kv_format == "nvfp4" and list(c.k_scales) == [2.0 ** -4] * 4 and list(c.v_scales) == [2.0 ** -4] * 4
          and c.block_bytes() == 4 * 2 * 4 * 32 * (64 // 2 + 64 // 16), (c.kv_format, c.k_scales, c.block_bytes()))
    c = E.engine_contract("vllm", "m", "w", s1, 32, tier_format="nvfp4", kv_scale={"k": [1, 2, 3, 4], "v": [0.5] * 4})
    check("kv_scale per layer, K and V", list(c.k_scales) == [1, 2, 3, 4] and list(c.v_scales) == [0.5] * 4)
    for bad, words in ((0.0, ["normal"]), ("x", ["kv_scale"]), ([1.0, 2.0], ["2 K", "4 layers"]),
                       ({"k": [1] * 4}, ["'k' and 'v'"]), (float("inf"), ["normal"])):
        ok, msg = raises(lambda: E.engine_contract("vllm", "m", "w", s1, 32, tier_format="nvfp4", kv_scale=bad), words)
        check(f"kv_scale {bad!r} refused", ok, msg)
    ok, msg = raises(lambda: E.engine_contract("vllm", "m", "w", s1, 32, kv_scale=0.5), ["kv_scale", "as-is"])
    check("kv_scale with as-is refused", ok, msg)
    ok, msg = raises(lambda: E.engine_contract("vllm", "m", "w", E.EngineShape(4, 4, 64, "fp8_e4m3"), 32,
                                               tier_format="nvfp4"), ["quantizes", "fp8_e4m3"])
    check("NVFP4 from FP8 pages refused", ok, msg)
    ok, msg = raises(lambda: E.engine_contract("vllm", "m", "w", s1, 32, tier_format="zip"), ["zip"])
    check("unknown tier format refused", ok, msg)

    base = dict(engine="vllm", model_name="m", weights="sha256:1", shape=s1, block_tokens=32, layout="cpu-bhnc")
    ids = {"base": E.engine_contract(**base).id()}
    ids["weights"] = E.engine_contract(**dict(base, weights="sha256:2")).id()
    ids["model"] = E.engine_contract(**dict(base, model_name="other")).id()
    ids["layout"] = E.engine_contract(**dict(base, layout="flash-nhd")).id()
    ids["block"] = E.engine_contract(**dict(base, block_tokens=64)).id()
    ids["rank"] = E.engine_contract(**dict(base, shape=s, tp_rank=1, tp_size=2)).id()
    ids["rank0"] = E.engine_contract(**dict(base, shape=s, tp_rank=0, tp_size=2)).id()
    ids["salt1"] = E.engine_contract(**dict(base, salt="s1")).id()
    ids["salt2"] = E.engine_contract(**dict(base, salt="s2")).id()
    ids["nvfp4"] = E.engine_contract(**dict(base, tier_format="nvfp4")).id()
    ids["fp8"] = E.engine_contract(**dict(base, tier_format="fp8")).id()
    ids["nvfp4_scale"] = E.engine_contract(**dict(base, tier_format="nvfp4", kv_scale=0.125)).id()
    check("every change of model, weights, layout, block, rank, salt, format or scale changes the contract",
          len(set(ids.values())) == len(ids), ids)
    check("the same inputs give the same contract", E.engine_contract(**base).id() == ids["base"])
    k1 = list(E.block_keys(ids["salt1"], list(range(100)), 32))
    k2 = list(E.block_keys(ids["salt2"], list(range(100)), 32))
    check("key chains of two salts share no key", len(k1) == 3 and not set(k1) & set(k2))
    check("folder identity changes with the weights", folder_identity_changes())


def folder_identity_changes():
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "config.json"), "w").write("{}")
        open(os.path.join(d, "model.safetensors"), "wb").write(b"a" * 100)
        i1 = E.folder_identity(d)
        open(os.path.join(d, "model.safetensors"), "wb").write(b"b" * 100)
        return i1 != E.folder_identity(d) and i1.startswith("sha256:")


def cpu_pages(num_blocks, H, T, D, layers, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(num_blocks, H, T, 2 * D, generator=g).to(torch.bfloat16) for _ in range(layers)]


def test_copies():
    L, H, T, D, NB = 3, 2, 32, 64, 7
    shape = E.EngineShape(L, H, D, "bfloat16")
    src = cpu_pages(NB, H, T, D, L, 1)
    dst = [torch.full_like(p, float("nan")) for p in src]  # poisoned
    names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
    w = _worker(None, shape, T, src)
    m = w._mover
    check("the connector moves pages with kvtier.pages (kind cpu, as-is)",
          isinstance(m, P.BlockMover) and m.layout.kind == "cpu" and m.mode == "as_is")
    ids = [0, 3, 6]
    rows = torch.empty(len(ids), m.block_bytes, dtype=torch.uint8)
    m.save(ids, rows)
    blk = rows.view(torch.bfloat16).view(len(ids), L, 2, H, T, D)
    ok = True
    for i, b in enumerate(ids):
        # What vLLM's CPU attention reads (cpu_attn.py forward): the page viewed as
        # (num_blocks, H, 2 * block_size, D), chunked in two on dim 2: K, then V.
        for l in range(L):
            kc, vc = src[l].view(NB, H, 2 * T, D).chunk(2, dim=2)
            ok = ok and torch.equal(blk[i, l, 0], kc[b]) and torch.equal(blk[i, l, 1], vc[b])
    check("kvtier blocks hold vLLM's K then V pages, HND (as vLLM's CPU kernel reads them)", ok)
    _worker(None, shape, T, dst)._mover.load(rows, ids)
    same = all(torch.equal(src[l][b].view(torch.int16), dst[l][b].view(torch.int16)) for l in range(L) for b in ids)
    untouched = all(torch.isnan(dst[l][b].float()).all() for l in range(L) for b in (1, 2, 4, 5))
    check("pages -> block -> pages is bit-exact", same)
    check("blocks not named are not written", untouched)
    ok, msg = raises(lambda: _worker(None, shape, 16, src), ["32-token blocks", "16"])
    check("pages of another block size refused", ok, msg)
    ok, msg = raises(lambda: _worker(None, shape, T, [p.float() for p in src]), ["float32", "bf16 pages"])
    check("fp32 pages refused", ok, msg)

    # NVFP4 mode: the block bytes are libkvtier's codec's over vLLM's K and V, with the
    # contract's scales; the load is the codec's decode rounded to BF16.
    q = _worker(None, shape, T, src, tier_format="nvfp4")
    c = q._contract(None, 0)
    check("NVFP4 mover: the contract's format, scales and block bytes",
          q._mover.mode == "nvfp4" and q._mover.k_scales == list(c.k_scales) and q._mover.block_bytes == c.block_bytes())
    rows = torch.empty(len(ids), q._mover.block_bytes, dtype=torch.uint8)
    q._mover.save(ids, rows)
    vals = H * T * D
    want, dec = [], []
    for b in ids:
        parts, vparts = [], []
        for l in range(L):
            for side, sc in zip(src[l].view(NB, H, 2 * T, D).chunk(2, dim=2), (c.k_scales[l], c.v_scales[l])):
                x = side[b].float().contiguous()
                data, scales = torch.empty(vals // 2, dtype=torch.uint8), torch.empty(vals // 16, dtype=torch.uint8)
                kvtier.nvfp4_encode(x.data_ptr(), vals, sc, 0, data.data_ptr(), scales.data_ptr())
                y = torch.empty(vals)
                kvtier.nvfp4_decode(data.data_ptr(), scales.data_ptr(), vals, sc, y.data_ptr())
                parts += [data, scales]
                vparts.append(y.view(H, T, D).to(torch.bfloat16))
        want.append(torch.cat(parts))
        dec.append(vparts)
    check("NVFP4 block bytes are libkvtier's codec's", torch.equal(rows, torch.stack(want)))
    out = [torch.full_like(p, float("nan")) for p in src]
    _worker(None, shape, T, out, tier_format="nvfp4")._mover.load(rows, ids)
    ok = all(torch.equal(out[l].view(NB, H, 2 * T, D)[b, :, s * T:(s + 1) * T].view(torch.int16),
                         dec[i][2 * l + s].view(torch.int16)) for i, b in enumerate(ids) for l in range(L) for s in (0, 1))
    check("NVFP4 load writes the codec's decode in vLLM's K and V rows", ok)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_link_and_daemon():
    L, H, T, D = 2, 2, 32, 64
    shape = E.EngineShape(L, H, D, "bfloat16")
    contract = E.engine_contract("vllm", "unit", "sha256:unit", shape, T, layout="cpu-bhnc")
    sock_dir = tempfile.mkdtemp(prefix="kvtier-link-")
    now = [0.0]
    lines = _Lines()
    lg = logging.getLogger("kvtier.test.link")
    lg.addHandler(lines)
    lg.propagate = False
    link = E.DaemonLink(os.path.join(sock_dir, "none.sock"), "unit", contracts=lambda: [contract], logger=lg,
                        clock=lambda: now[0])
    check("no daemon: client() is None", link.client() is None)
    check("no daemon: client() again within the backoff does not retry",
          link.client() is None and len(lines.lines) == 1, lines.lines)
    now[0] += 100
    link.client()
    check("one warning per outage", len(lines.lines) == 1, lines.lines)

    d = kvtier.daemon.Daemon(slot_bytes=contract.block_bytes(), hbm=None, host="64MiB", nvme="128MiB")
    try:
        link.socket_path = d.socket
        now[0] += 100
        c = link.client()
        check("daemon up: attached, the contract registered", c is not None and contract.id() in c._block_bytes)
        check("one line when it is back", len(lines.lines) == 2 and "back" in lines.lines[1], lines.lines)

        # Save one block from pages through a staging slot, load it into other pages from
        # the read-only arena: bit-exact.
        from kvtier.vllm import block_bytes_view
        src = cpu_pages(4, H, T, D, L, 2)
        dst = [torch.zeros_like(p) for p in src]
        tokens = list(range(3, 3 + 2 * T))
        cid = contract.id()
        keys = E.block_keys(cid, tokens, T)
        bb = c._block_bytes[cid]
        lease = c.alloc(cid, 2, "host")
        _worker(None, shape, T, src)._mover.save([1, 2], [block_bytes_view(c.host_slot_address(s), bb)
                                                          for s in lease.slots])
        n = c.commit_chain(cid, lease, lease.slots, keys)
        c.release(lease)
        check("two blocks committed", n == 2, n)
        lease = c.acquire(cid, keys, "host")
        _worker(None, shape, T, dst)._mover.load([block_bytes_view(c.host_slot_address(s, cid), bb)
                                                  for s in lease.slots], [2, 3])
        c.release(lease)
        ok = all(torch.equal(src[l][1 + i].view(torch.int16), dst[l][2 + i].view(torch.int16))
                 for l in range(L) for i in range(2))
        check("save then load through kvtierd is bit-exact", len(lease.slots) == 2 and ok)
    finally:
        d.stop()
    err = None
    try:
        c.lookup(contract.id(), keys)
    except kvtier.KvtierError as e:
        err = e
    check("a stopped daemon answers an error", err is not None, err)
    if err is not None:
        link.failed(err)
        check("the lost daemon is noticed once", link.client() is None and len(lines.lines) == 3, lines.lines)
    link.close()


def _worker(link, shape, T, layers, tier_format="as-is", kv_scale=None):
    """A worker-side KvtierConnector without vLLM's config objects: the attributes its
    __init__ sets from them, its real register_kv_caches (which builds the BlockMover), and
    its real _save/_load/get_block_ids_with_load_errors."""
    from kvtier.vllm import KvtierConnector, _Once
    c = KvtierConnector.__new__(KvtierConnector)
    c.shape, c.block_tokens, c.tp_rank, c.tp_size, c._ranks = shape, T, 0, 1, [0]
    c.model_name, c.weights, c.tier_format, c._contracts = "unit", "sha256:unit-load", tier_format, {}
    c.kv_scale = kv_scale
    c.link, c._once, c._load_errors = link, _Once(), set()
    c.loaded_blocks = c.saved_blocks = 0
    c.register_kv_caches({f"model.layers.{i}.self_attn.attn": x for i, x in enumerate(layers)})
    return c


def test_load_errors():
    """Blocks that are not in kvtierd, or a daemon that is gone, are load errors (vLLM
    recomputes them) and their pages are not written."""
    from kvtier.vllm import _Transfer
    L, H, T, D, NB = 2, 2, 32, 64, 8
    shape = E.EngineShape(L, H, D, "bfloat16")
    probe = E.engine_contract("vllm", "unit", "sha256:unit-load", shape, T, layout="cpu-bhnc")
    d = kvtier.daemon.Daemon(slot_bytes=probe.block_bytes(), hbm=None, host="64MiB", nvme="128MiB")
    try:
        src = cpu_pages(NB, H, T, D, L, 3)
        w = _worker(E.DaemonLink(d.socket, "unit-w"), shape, T, src)
        tokens = list(range(7, 7 + 4 * T + 5))
        w._save(_Transfer("r", None, tokens[:2 * T], 0, [1, 2]))  # blocks 0 and 1 of the chain
        check("two blocks saved from the pages", w.saved_blocks == 2, w.saved_blocks)
        dst = [torch.full_like(p, 7.0) for p in src]
        r = _worker(E.DaemonLink(d.socket, "unit-r"), shape, T, dst)
        r._load(_Transfer("r", None, tokens[:4 * T], 0, [4, 5, 6, 7]))
        errs = r.get_block_ids_with_load_errors()
        ok = all(torch.equal(dst[l][4 + i].view(torch.int16), src[l][1 + i].view(torch.int16))
                 for l in range(L) for i in range(2))
        check("the cached blocks load bit-exact", r.loaded_blocks == 2 and ok, r.loaded_blocks)
        check("the missing blocks are load errors", errs == {6, 7}, errs)
        check("a load error's pages are not written", all(bool((dst[l][b] == 7.0).all()) for l in range(L)
                                                           for b in (6, 7)))
        check("load errors are reported once", r.get_block_ids_with_load_errors() == set())
        s1 = _worker(E.DaemonLink(d.socket, "unit-s"), shape, T, src)
        s1._save(_Transfer("r", "salt-1", tokens[:2 * T], 0, [1, 2]))
        r2 = _worker(E.DaemonLink(d.socket, "unit-r2"), shape, T, dst)
        r2._load(_Transfer("r", "salt-2", tokens[:2 * T], 0, [4, 5]))
        check("another salt's blocks are load errors", r2.get_block_ids_with_load_errors() == {4, 5})

        # NVFP4 in the tiers: a second writer stores NVFP4 blocks under the same tokens; an
        # as-is reader still gets its BF16 blocks, an NVFP4 reader gets the NVFP4 ones (the
        # codec's decode, within NVFP4's error of the source), never one as the other.
        q = _worker(E.DaemonLink(d.socket, "unit-q"), shape, T, src, tier_format="nvfp4")
        q._save(_Transfer("r", None, tokens[:2 * T], 0, [1, 2]))
        check("NVFP4 blocks saved", q.saved_blocks == 2, q.saved_blocks)
        qd = [torch.full_like(p, 7.0) for p in src]
        qr = _worker(E.DaemonLink(d.socket, "unit-qr"), shape, T, qd, tier_format="nvfp4")
        qr._load(_Transfer("r", None, tokens[:2 * T], 0, [4, 5]))
        check("an NVFP4 reader loads the NVFP4 blocks", qr.get_block_ids_with_load_errors() == set()
              and qr.loaded_blocks == 2, qr.loaded_blocks)
        want = torch.empty(2, q._mover.block_bytes, dtype=torch.uint8)
        q._mover.save([1, 2], want)
        got = torch.empty(2, q._mover.block_bytes, dtype=torch.uint8)
        qr._mover.save([4, 5], got)
        check("the loaded pages re-encode to the stored NVFP4 bytes", torch.equal(want, got))
        err = max(float((qd[l][4 + i].float() - src[l][1 + i].float()).abs().max()) for l in range(L) for i in range(2))
        amax = max(float(src[l][1 + i].float().abs().max()) for l in range(L) for i in range(2))
        # E2M1 step at the top of a 16-value group is 2 (of 6): |error| <= amax / 6 (plus the
        # E4M3 rounding of the group scale and BF16's rounding).
        check("NVFP4 load is within NVFP4's error", err <= 1.07 * amax / 6, (err, amax))
        r3 = _worker(E.DaemonLink(d.socket, "unit-r3"), shape, T, dst, tier_format="fp8")
        r3._load(_Transfer("r", None, tokens[:2 * T], 0, [4, 5]))
        check("an FP8 reader finds neither the BF16 nor the NVFP4 blocks",
              r3.get_block_ids_with_load_errors() == {4, 5})
        # A corrupt NVFP4 block (an E4M3 NaN scale byte) is a load error, its pages unwritten.
        client, cid = q._client_and_id("corrupt", 0)
        bb = client._block_bytes[cid]
        lease = client.alloc(cid, 1, "host")
        from kvtier.vllm import block_bytes_view
        row = block_bytes_view(client.host_slot_address(lease.slots[0]), bb)
        q._mover.save([1], [row])
        row[H * T * D // 2] = 0x7F  # layer 0's first K scale
        client.commit_chain(cid, lease, lease.slots, E.block_keys(cid, tokens[:T], T))
        client.release(lease)
        cd = [torch.full_like(p, 7.0) for p in src]
        cr = _worker(E.DaemonLink(d.socket, "unit-cr"), shape, T, cd, tier_format="nvfp4")
        cr._load(_Transfer("r", "corrupt", tokens[:T], 0, [3]))
        check("a corrupt NVFP4 block is a load error, its pages not written",
              cr.get_block_ids_with_load_errors() == {3} and all(bool((cd[l] == 7.0).all()) for l in range(L)))
    finally:
        d.stop()
    r._load(_Transfer("r", None, tokens[:4 * T], 0, [4, 5, 6, 7]))
    check("with the daemon gone every block is a load error", r.get_block_ids_with_load_errors() == {4, 5, 6, 7})
    r.link.close()


def main():
    for t in (test_shapes_and_contracts, test_copies, test_link_and_daemon, test_load_errors):
        try:
            t()
        except Exception as e:  # reported as a failure, and the other groups still run
            import traceback
            traceback.print_exc()
            check(t.__name__, False, f"{type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
