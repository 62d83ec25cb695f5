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
import threading
import time

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


def shipped_daemon():
    """kvtierd on the shipped config/kvtier.toml with only its capacities set, as users run it."""
    return kvtier.daemon.Daemon.shipped({"tiers.host.capacity": "64MiB", "tiers.nvme.capacity": "128MiB"})


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
    ok, msg = raises(lambda: _worker(None, shape, T, [p.float() for p in src]), ["float32", "bfloat16 pages"])
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
    scratch = tempfile.TemporaryDirectory(prefix="kvtier-link-")
    sock_dir = scratch.name
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

    d = shipped_daemon()
    try:
        link.socket_path = d.socket
        now[0] += 100
        c = link.client()
        check("daemon up: attached, the contract registered", c is not None and contract.id() in c._block_bytes)
        check("one line when it is back", len(lines.lines) == 2 and "back" in lines.lines[1], lines.lines)

        # Save one block from pages through a staging slot, load it into other pages from
        # the read-only arena: bit-exact.
        view = E.slot_view
        src = cpu_pages(4, H, T, D, L, 2)
        dst = [torch.zeros_like(p) for p in src]
        tokens = list(range(3, 3 + 2 * T))
        cid = contract.id()
        keys = E.block_keys(cid, tokens, T)
        bb = c._block_bytes[cid]
        lease = c.alloc(cid, 2, "host")
        _worker(None, shape, T, src)._mover.save([1, 2], [view(c, s, cid, bb) for s in lease.slots])
        n = c.commit_chain(cid, lease, lease.slots, keys)
        c.release(lease)
        check("two blocks committed", n == 2, n)
        lease = c.acquire(cid, keys, "host")
        _worker(None, shape, T, dst)._mover.load([view(c, s, cid, bb) for s in lease.slots], [2, 3])
        c.release(lease)
        ok = all(torch.equal(src[l][1 + i].view(torch.int16), dst[l][2 + i].view(torch.int16))
                 for l in range(L) for i in range(2))
        check("save then load through kvtierd is bit-exact", len(lease.slots) == 2 and ok)
        d.stop(keep=True)
        err = None
        try:
            c.lookup(contract.id(), keys)
        except kvtier.KvtierError as e:
            err = e
        check("a stopped daemon answers an error", err is not None, err)
        if err is not None:
            link.failed(err)
            check("the lost daemon is noticed once", link.client() is None and len(lines.lines) == 3, lines.lines)

        # A daemon that starts again (a new socket file) is attached at the next call, not
        # after the back-off: the clock stands still here.
        d.start()
        c = link.client()
        check("a restarted daemon is attached at once, inside the back-off", c is not None and len(lines.lines) == 4
              and "back" in lines.lines[3], lines.lines)
        # Killed -9, its socket file stays: calls within the back-off try nothing; the
        # daemon started again is attached at the next call.
        d.kill()
        io = E.BlockIO(link)
        check("a killed daemon: a lookup is a miss", io.lookup(contract, keys) == 0)
        check("a killed daemon: no retry within the back-off", link.client() is None and len(lines.lines) == 5,
              lines.lines)
        d.start()
        check("killed and started again: attached at the next call, inside the back-off",
              link.client() is not None and len(lines.lines) == 6, lines.lines)
        fresh = E.block_keys(cid, list(range(7, 7 + 2 * T)), T)
        check("killed and started again: blocks are stored and found again",
              io.save(contract, fresh, lambda rows, i, m: None) == 2 and io.lookup(contract, fresh) == 2)
    finally:
        d.stop()
    link.close()


def _worker(link, shape, T, layers, tier_format="as-is", kv_scale=None, layout="cpu-bhnc", engine_scales=None):
    """A worker-side KvtierConnector without vLLM's config objects: the attributes its
    __init__ sets from them, its real register_kv_caches (which builds the BlockMover), and
    its real _save/_load/get_block_ids_with_load_errors. engine_scales: the (k_scale,
    v_scale) per layer that vLLM's attention layers hold (an FP8 engine's), handed to the
    connector where vLLM does: the attention layers of the forward context."""
    from types import SimpleNamespace as NS
    from kvtier.vllm import KvtierConnector
    c = KvtierConnector.__new__(KvtierConnector)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(len(layers))]
    if engine_scales is not None:
        ctx = {n: NS(_k_scale_float=k, _v_scale_float=v) for n, (k, v) in zip(names, engine_scales)}
        c._vllm_config = NS(compilation_config=NS(static_forward_context=ctx))
    c.page_layout = layout
    c.shape, c.block_tokens, c.tp_rank, c.tp_size, c._ranks = shape, T, 0, 1, [0]
    c.model_name, c.weights, c.tier_format, c._contracts = "unit", "sha256:unit-load", tier_format, {}
    c.kv_scale = kv_scale
    c.link, c._load_errors = link, set()
    c.io = E.BlockIO(link)
    c._init_saver()
    c.register_kv_caches(dict(zip(names, layers)))
    return c


def test_load_errors():
    """Blocks that are not in kvtierd, or a daemon that is gone, are load errors (vLLM
    recomputes them) and their pages are not written."""
    from kvtier.vllm import _Transfer
    L, H, T, D, NB = 2, 2, 32, 64, 8
    shape = E.EngineShape(L, H, D, "bfloat16")
    d = shipped_daemon()
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
        client, cid = q.link.attach(q._contract("corrupt", 0))
        bb = client._block_bytes[cid]
        lease = client.alloc(cid, 1, "host")
        view = E.slot_view
        row = view(client, lease.slots[0], cid, bb)
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


class _GatedMover:
    """The worker's real BlockMover behind a gate (fault injection): save() waits until the
    test opens the gate, or raises `fail` when set."""

    def __init__(self, mover, fail=None):
        self.mover, self.fail = mover, fail
        self.block_bytes = mover.block_bytes
        self.gate, self.entered = threading.Event(), threading.Event()

    def save(self, block_ids, rows):
        self.entered.set()
        if self.fail is not None:
            raise self.fail
        if not self.gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        self.mover.save(block_ids, rows)

    def load(self, rows, block_ids):
        self.mover.load(rows, block_ids)


def _in_thread(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def _poll(fn, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_async_saves():
    """Saves run on the save thread: wait_for_save returns while a save still copies, a
    finished request is reported in finished_sending only once its saves copied out of the
    pages (and exactly once), a preemption waits for the copies, the bytes are the pages',
    and a failing save is one log line and a reported request, never an exception."""
    from kvtier.vllm import KvtierConnectorMetadata, _Transfer
    L, H, T, D, NB = 2, 2, 32, 64, 8
    shape = E.EngineShape(L, H, D, "bfloat16")
    lines = _Lines()
    vlog = logging.getLogger("vllm.kvtier")
    vlog.addHandler(lines)
    d = shipped_daemon()
    try:
        src = cpu_pages(NB, H, T, D, L, 11)
        w = _worker(E.DaemonLink(d.socket, "unit-async", logger=vlog), shape, T, src)  # as the connector makes it
        gated = _GatedMover(w._mover)
        w._mover = gated
        tokens = list(range(50, 50 + 3 * T + 9))
        w.bind_connector_metadata(KvtierConnectorMetadata(saves=[_Transfer("r1", None, tokens[:3 * T], 0, [5, 1, 6])]))
        t = _in_thread(w.wait_for_save)
        t.join(10)
        check("wait_for_save returns while the save is still copying", not t.is_alive() and gated.entered.wait(10))
        check("a finished request whose save is copying is not reported", w.get_finished({"r1", "r9"}) == (None, None))
        t = _in_thread(w.handle_preemptions, KvtierConnectorMetadata(preempted={"r1"}))
        t.join(0.5)
        waited = t.is_alive()
        gated.gate.set()
        t.join(20)
        check("a preemption waits for the request's copies, then goes on", waited and not t.is_alive())
        got = _poll(lambda: w.get_finished(set())[0])
        check("the finished request is reported in finished_sending once its save copied", got == {"r1"}, got)
        check("reported once", w.get_finished({"r1"}) == (None, None))
        check("the save ends (commit included)", w.drain_saves(20) and w.saved_blocks == 3, w.saved_blocks)
        dst = [torch.full_like(p, 7.0) for p in src]
        r = _worker(E.DaemonLink(d.socket, "unit-async-r"), shape, T, dst)
        r._load(_Transfer("r", None, tokens[:3 * T], 0, [0, 2, 3]))
        ok = all(torch.equal(dst[l][a].view(torch.int16), src[l][b].view(torch.int16))
                 for l in range(L) for a, b in ((0, 5), (2, 1), (3, 6)))
        check("the blocks saved in the background load bit-exact", r.loaded_blocks == 3 and ok, r.loaded_blocks)

        # A request reported before it finished is not reported; a request with saves that
        # finishes after they ended is reported at once.
        gated.gate.set()
        w.bind_connector_metadata(KvtierConnectorMetadata(saves=[_Transfer("r2", None, tokens[:T], 0, [2])]))
        w.wait_for_save()
        w.drain_saves(20)
        check("a request still running is not reported", w.get_finished(set()) == (None, None))
        check("a request whose saves ended is reported when it finishes", w.get_finished({"r2"})[0] == {"r2"})

        # Failing saves: an injected exception, a refused block id: one line each, reported.
        n0 = len(lines.lines)
        w._mover = _GatedMover(gated.mover, fail=RuntimeError("injected"))
        for rid in ("e1", "e2"):
            w.bind_connector_metadata(KvtierConnectorMetadata(saves=[_Transfer(rid, None, tokens[:T], 0, [3])]))
            w.wait_for_save()
        w.drain_saves(20)  # the save thread reads the mover when a save runs
        w._mover = gated.mover
        w.bind_connector_metadata(KvtierConnectorMetadata(saves=[_Transfer("e3", None, tokens[:T], 0, [NB + 5])]))
        w.wait_for_save()
        w.drain_saves(20)
        got = w.get_finished({"e1", "e2", "e3"})[0]
        new = lines.lines[n0:]
        check("failed saves: reported finished, one log line per kind of failure",
              got == {"e1", "e2", "e3"} and len(new) == 2 and "injected" in new[0] and "outside" in new[1],
              (got, new))
        # The daemon gone: the save thread's error drops the connection, nothing raised.
        d.stop()
        w.bind_connector_metadata(KvtierConnectorMetadata(saves=[_Transfer("e4", None, tokens[:2 * T], 0, [3, 4])]))
        w.wait_for_save()
        check("with the daemon gone a save ends and its request is reported",
              w.drain_saves(30) and w.get_finished({"e4"})[0] == {"e4"})
    finally:
        d.stop()
        vlog.removeHandler(lines)
    w.shutdown()
    r.link.close()


def _scheduler(T):
    """A scheduler-side KvtierConnector without vLLM's config objects (the attributes its
    __init__ sets), to drive its real build_connector_meta and request_finished."""
    from kvtier.vllm import KvtierConnector
    c = KvtierConnector.__new__(KvtierConnector)
    c.block_tokens, c.tp_rank, c.tp_size, c._ranks = T, 0, 1, [0]
    c._reqs, c._loads, c._saving = {}, [], set()
    return c


def _scheduler_on(socket, T, shape, name, cost=None):
    """A scheduler-side KvtierConnector (as _scheduler) that looks up in the kvtierd at
    `socket` under the contract _worker's connectors save with."""
    s = _scheduler(T)
    s.link = E.DaemonLink(socket, name)
    s.io = E.BlockIO(s.link)
    s.model_name, s.weights, s.tier_format, s._contracts = "unit", "sha256:unit-load", "as-is", {}
    s.shape, s.page_layout, s.kv_scale = shape, "cpu-bhnc", None
    s.cost = cost
    return s


def test_last_block():
    """A prompt that ends on a block's edge loads every block, the last one too: the answer
    stops one token short (vLLM computes the last token for its logits), the load names
    the last block, and its bytes arrive in vLLM's pages. A prompt with a partial last
    block answers its full blocks."""
    from types import SimpleNamespace as NS
    from kvtier.vllm import KvtierConnectorMetadata, _Transfer
    L, H, T, D, NB = 2, 2, 32, 64, 10
    shape = E.EngineShape(L, H, D, "bfloat16")
    d = shipped_daemon()
    try:
        src = cpu_pages(NB, H, T, D, L, 7)
        w = _worker(E.DaemonLink(d.socket, "unit-last-w"), shape, T, src)
        tokens = list(range(21, 21 + 4 * T))
        w._save(_Transfer("w", None, tokens, 0, [1, 2, 3, 4]))
        check("four blocks saved", w.saved_blocks == 4, w.saved_blocks)
        s = _scheduler_on(d.socket, T, shape, "unit-last-s")
        got = {}
        for local in (0, T, 3 * T):
            got[local] = s.get_num_new_matched_tokens(NS(prompt_token_ids=tokens, request_id=f"q{local}",
                                                        cache_salt=None), local)
        check("a prompt of whole blocks: every block but its last token, less vLLM's own hit",
              got == {0: (4 * T - 1, False), T: (3 * T - 1, False), 3 * T: (T - 1, False)}, got)
        partial = tokens[:3 * T] + [7] * (T // 2)
        got = s.get_num_new_matched_tokens(NS(prompt_token_ids=partial, request_id="p", cache_salt=None), 0)
        check("a prompt with a partial last block: its full blocks", got == (3 * T, False), got)
        s.update_state_after_alloc(NS(request_id=f"q{T}"), NS(get_block_ids=lambda: ([6, 7, 8, 9],)), 3 * T - 1)
        loads = [(t.first, t.block_ids, len(t.tokens)) for t in s._loads]
        check("the load names the blocks after vLLM's hit, the last one included", loads == [(1, [7, 8, 9], 4 * T)],
              loads)
        dst = [torch.zeros_like(p) for p in src]
        r = _worker(E.DaemonLink(d.socket, "unit-last-r"), shape, T, dst)
        r.bind_connector_metadata(KvtierConnectorMetadata(loads=s._loads))
        r.start_load_kv(None)
        r.clear_connector_metadata()
        same = all(torch.equal(dst[l][b].view(torch.int16), src[l][a].view(torch.int16)) for l in range(L)
                   for a, b in ((2, 7), (3, 8), (4, 9)))
        check("the last block's bytes arrive in vLLM's pages",
              same and r.loaded_blocks == 3 and not r.get_block_ids_with_load_errors(), r.loaded_blocks)
        for c in (w, r, s):
            c.link.close()
    finally:
        d.stop()


def test_scheduler_delays_frees():
    """request_finished keeps a request's blocks (True) exactly when a save of it was put in
    some step's metadata, the rule the workers report finished_sending by; the metadata
    carries vLLM's preempted requests to the workers."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
    from vllm.v1.request import Request
    from kvtier.vllm import _ReqState
    T = 32
    s = _scheduler(T)
    tok = list(range(1, 3 * T + 6))
    for rid, n in (("saves", len(tok)), ("short", T - 2)):
        s._reqs[rid] = _ReqState(tokens=tok[:n], salt=None)
    out = SchedulerOutput.make_empty()
    for rid, blocks in (("saves", [10, 11, 12, 13]), ("short", [20])):
        out.scheduled_new_reqs.append(NewRequestData(
            req_id=rid, prompt_token_ids=s._reqs[rid].tokens, mm_features=[], sampling_params=None,
            pooling_params=None, block_ids=(blocks,), num_computed_tokens=0, lora_request=None))
        out.num_scheduled_tokens[rid] = len(s._reqs[rid].tokens)
    out.preempted_req_ids = {"gone"}
    meta = s.build_connector_meta(out)
    saves = [(t.req_id, t.first, t.block_ids) for t in meta.saves]
    check("the step's full blocks are saved, the preempted requests passed on",
          saves == [("saves", 0, [10, 11, 12])] and meta.preempted == {"gone"}, (saves, meta.preempted))

    def req(rid):
        return Request(request_id=rid, prompt_token_ids=tok, sampling_params=SamplingParams(max_tokens=1),
                       pooling_params=None)
    check("request_finished delays the free of a request with a save", s.request_finished(req("saves"), []) == (True, None))
    check("request_finished frees a request without a save at once", s.request_finished(req("short"), []) == (False, None))
    check("a request is delayed once", s.request_finished(req("saves"), []) == (False, None))


def test_load_or_compute():
    """Load or compute: LoadCost's rule on its own, then the connector's: a worker's real
    loads and steps timed and reported with its step output, and a scheduler that feeds
    them to its LoadCost and leaves to vLLM a hit predicted slower to load than to compute
    (against a real kvtierd holding the blocks), probing every 16th, loading again once
    loads are measured fast."""
    from types import SimpleNamespace as NS
    from kvtier.vllm import (KvtierConnectorMetadata, KvtierWorkerMetadata, _ReqState, _StepClock,  # noqa: F401
                             _Transfer)
    c = E.LoadCost(window=8, min_samples=3, probe_every=4, min_step_tokens=64)
    check("with no measurements a load goes ahead", c.worth_loading(10, 320) and c.estimate(10, 320) == (None, None))
    for s_ in (1e-3, 1e-3, 9.0):       # a slow outlier does not move the median
        c.add_load(s_ * 10, 10)
    for s_ in (1e-4, 1e-4, 1e-4):
        c.add_step(s_ * 640, 640)
    c.add_step(100.0, 8)               # a decode-sized step is left out
    load_s, compute_s = c.estimate(10, 320)
    check("medians per block and per token", abs(load_s - 0.01) < 1e-9 and abs(compute_s - 0.032) < 1e-9,
          (load_s, compute_s))
    check("measurements counted (the decode-sized step left out)", (c.loads_seen, c.steps_seen) == (3, 3),
          (c.loads_seen, c.steps_seen))
    check("a load cheaper than its compute goes ahead", c.worth_loading(10, 320) and c.declined == 0)
    for s_ in (0.05, 0.05, 0.05):
        c.add_load(s_ * 10, 10)
    got = [c.worth_loading(10, 320) for _ in range(8)]
    check("a load dearer than its compute is declined, every 4th probes",
          got == [False, False, False, True] * 2 and c.declined == 8 and c.probes == 2, got)
    try:
        E.LoadCost(window=0)
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    check("bad LoadCost settings are refused", "window" in refused, refused)

    L, H, T, D, NB = 2, 2, 32, 64, 8
    shape = E.EngineShape(L, H, D, "bfloat16")
    d = shipped_daemon()
    try:
        src = cpu_pages(NB, H, T, D, L, 5)
        w = _worker(E.DaemonLink(d.socket, "unit-cost-w"), shape, T, src)
        tokens = list(range(11, 11 + 4 * T + 3))
        w._save(_Transfer("r", None, tokens[:4 * T], 0, [1, 2, 3, 4]))
        check("four blocks saved", w.saved_blocks == 4, w.saved_blocks)
        # The worker's clock around a real load in a step of vLLM's hooks.
        r = _worker(E.DaemonLink(d.socket, "unit-cost-r"), shape, T, [torch.zeros_like(p) for p in src])
        r._clock = _StepClock(False, 2 * T)
        r.bind_connector_metadata(KvtierConnectorMetadata(
            loads=[_Transfer("r", None, tokens[:4 * T], 0, [4, 5, 6, 7])], step_tokens=3 * T))
        r.start_load_kv(None)
        r.wait_for_save()
        m = r.build_connector_worker_meta()
        check("a timed step reports its load (4 blocks) and its compute (96 tokens)",
              isinstance(m, KvtierWorkerMetadata) and [b for _, b in m.loads] == [4]
              and [t for _, t in m.steps] == [3 * T] and all(x >= 0 for x, _ in m.loads + m.steps), m)
        r.bind_connector_metadata(KvtierConnectorMetadata(step_tokens=1))
        r.wait_for_save()
        check("a decode-sized step is not reported", r.build_connector_worker_meta() is None)
        r.clear_connector_metadata()

        s = _scheduler_on(d.socket, T, shape, "unit-cost-s",
                          E.LoadCost(min_samples=2, probe_every=16, min_step_tokens=2 * T))
        req = NS(prompt_token_ids=tokens, request_id="q", cache_salt=None)
        check("with no measurements the scheduler loads the hit", s.get_num_new_matched_tokens(req, 0) == (4 * T, False))
        slow = KvtierWorkerMetadata(loads=[(0.4, 4), (0.4, 4)], steps=[(0.01, 3 * T), (0.01, 3 * T)])
        s.update_connector_output(NS(kv_connector_worker_meta=slow))
        got = [s.get_num_new_matched_tokens(req, 0)[0] for _ in range(16)]
        check("a hit measured slower to load than to compute is left to vLLM, the 16th loads to measure again",
              got == [0] * 15 + [4 * T] and s.cost.declined == 16, got)
        check("a declined hit is not saved again", s._reqs["q"].saved_upto == 4)
        fast = KvtierWorkerMetadata(loads=[(1e-4, 4)] * 4, steps=[])
        s.update_connector_output(NS(kv_connector_worker_meta=fast))
        check("once loads are measured fast the hit loads again", s.get_num_new_matched_tokens(req, 0) == (4 * T, False))
        s.update_connector_output(NS(kv_connector_worker_meta=None))
        s.cost = None
        s.update_connector_output(NS(kv_connector_worker_meta=slow))
        check("load_if_cheaper false: every hit loads", s.get_num_new_matched_tokens(req, 0) == (4 * T, False))
        s.link.close()
        r.link.close()
        w.link.close()
    finally:
        d.stop()


def test_fp8_pages():
    """vLLM's FP8 (E4M3) pages stored as they are: byte-exact both ways, vLLM's per-layer
    k/v scales in the contract (checked against the model's at register time), and an FP8
    block never loads into a BF16 engine, an engine of other scales, or a BF16 engine that
    quantizes to FP8 itself."""
    from kvtier.vllm import _Transfer, FP8_PAGES_TAG
    L, H, T, D, NB = 2, 2, 32, 64, 6
    shape = E.EngineShape(L, H, D, "fp8_e4m3")
    bshape = E.EngineShape(L, H, D, "bfloat16")
    lay8 = "cpu-bhnc" + FP8_PAGES_TAG
    g = torch.Generator().manual_seed(21)
    # E4M3 bytes of random values (vLLM CPU's FP8 cache is a uint8 tensor).
    src = [(torch.randn(NB, H, T, 2 * D, generator=g) * 4).to(torch.float8_e4m3fn).view(torch.uint8)
           for _ in range(L)]
    ones = [(1.0, 1.0)] * L
    w = _worker(None, shape, T, src, layout=lay8, engine_scales=ones)
    c = w._contract(None, 0)
    check("FP8 pages: an fp8 contract with vLLM's scales (1.0)", c.kv_format == "fp8" and list(c.k_scales) == [1.0] * L
          and w._mover.block_bytes == c.block_bytes() == L * 2 * H * T * D, (c.kv_format, c.k_scales))
    ids = [4, 0, 2]
    rows = torch.empty(len(ids), w._mover.block_bytes, dtype=torch.uint8)
    w._mover.save(ids, rows)
    blk = rows.view(len(ids), L, 2, H, T, D)
    ok = all(torch.equal(blk[i, l, s], src[l].view(NB, H, 2 * T, D)[b, :, s * T:(s + 1) * T])
             for i, b in enumerate(ids) for l in range(L) for s in (0, 1))
    check("FP8 blocks hold vLLM's K then V bytes, HND", ok)
    dst = [torch.full_like(p, 0x55) for p in src]
    _worker(None, shape, T, dst, layout=lay8, engine_scales=ones)._mover.load(rows, ids)
    check("FP8 pages -> block -> pages is byte-exact",
          all(torch.equal(dst[l][b], src[l][b]) for l in range(L) for b in ids)
          and all(bool((dst[l][b] == 0x55).all()) for l in range(L) for b in (1, 3, 5)))
    ok, msg = raises(lambda: _worker(None, shape, T, src, layout=lay8, engine_scales=[(1.0, 1.0), (0.5, 1.0)]),
                     ["k_scale 0.5", "kv_scale"])
    check("FP8 pages whose vLLM scales are not the contract's are refused", ok, msg)
    ok, msg = raises(lambda: _worker(None, shape, T, src, layout=lay8), ["k_scale"])
    check("FP8 pages whose scales cannot be read are refused", ok, msg)
    w5 = _worker(None, shape, T, src, layout=lay8, kv_scale=0.5, engine_scales=[(0.5, 0.5)] * L)
    check("kv_scale names an FP8 engine's scales (accepted when they are the model's)",
          list(w5._contract(None, 0).k_scales) == [0.5] * L)
    ids_ = {"fp8": c.id(), "fp8-0.5": w5._contract(None, 0).id(),
            "bf16": E.engine_contract("vllm", "unit", "sha256:unit-load", bshape, T, layout="cpu-bhnc").id(),
            "bf16->fp8": E.engine_contract("vllm", "unit", "sha256:unit-load", bshape, T, layout="cpu-bhnc",
                                           tier_format="fp8").id()}
    check("FP8 pages, other scales, BF16 pages and BF16 quantized to FP8 are four contracts",
          len(set(ids_.values())) == 4, ids_)

    d = shipped_daemon()
    try:
        tokens = list(range(900, 900 + 2 * T + 3))
        s8 = _worker(E.DaemonLink(d.socket, "unit-fp8"), shape, T, src, layout=lay8, engine_scales=ones)
        s8._save(_Transfer("r", None, tokens[:2 * T], 0, [4, 2]))
        r8 = _worker(E.DaemonLink(d.socket, "unit-fp8-r"), shape, T, dst, layout=lay8, engine_scales=ones)
        r8._load(_Transfer("r", None, tokens[:2 * T], 0, [1, 3]))
        check("FP8 blocks through kvtierd load byte-exact into an FP8 engine of the same scales",
              s8.saved_blocks == 2 and r8.get_block_ids_with_load_errors() == set()
              and all(torch.equal(dst[l][1], src[l][4]) and torch.equal(dst[l][3], src[l][2]) for l in range(L)))
        bd = cpu_pages(NB, H, T, D, L, 22)
        others = (_worker(E.DaemonLink(d.socket, "unit-bf16"), bshape, T, bd),
                  _worker(E.DaemonLink(d.socket, "unit-bf16-fp8"), bshape, T, bd, tier_format="fp8"),
                  _worker(E.DaemonLink(d.socket, "unit-fp8-half"), shape, T, [p.clone() for p in src], layout=lay8,
                          kv_scale=0.5, engine_scales=[(0.5, 0.5)] * L))
        errs = []
        for o in others:
            o._load(_Transfer("r", None, tokens[:2 * T], 0, [1, 3]))
            errs.append(o.get_block_ids_with_load_errors())
        check("a BF16 engine, a BF16 engine quantizing to FP8 and an FP8 engine of other scales load none",
              errs == [{1, 3}] * 3, errs)
    finally:
        d.stop()


def _cuda_layout(kind, order, NB, H, T, D, seed):
    """A tensor shaped and strided as a vLLM CUDA backend's KV cache (on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(NB * 2 * H * T * D, generator=g).to(torch.bfloat16)
    if kind == "flash_attn":
        if order == "NHD":
            return x.view(2, NB, T, H, D)
        return x.view(2, NB, H, T, D).permute(0, 1, 3, 2, 4)
    if order == "NHD":
        return x.view(NB, 2, T, H, D)
    return x.view(NB, 2, H, T, D).permute(0, 1, 3, 2, 4)


def _kv_of(kind, cache, b):
    """(K, V) of block b as [H, T, D] (kvtier's HND page order)."""
    k, v = (cache[0][b], cache[1][b]) if kind == "flash_attn" else (cache[b][0], cache[b][1])
    return k.permute(1, 0, 2), v.permute(1, 0, 2)


def test_cuda_layouts():
    """The layouts vLLM's CUDA backends hand a connector before vLLM 0.32 (FlashAttention
    (2, NB, T, H, D), FlashInfer (NB, 2, T, H, D), NHD or HND by stride order), taken by the
    connector when its platform is CUDA; exercised here on CPU tensors in those shapes and
    strides through BlockMover's CPU path (the device copies are kvtier.pages' own, tested on
    a GPU by its tests). vLLM 0.32's own CUDA layout is kvtier.pages' kind vllm_cuda."""
    from kvtier.vllm import _Transfer
    L, H, T, D, NB = 2, 2, 16, 64, 5
    shape = E.EngineShape(L, H, D, "bfloat16")
    ids = [3, 0, 4]
    variants = [(k, o) for k in ("flash_attn", "flashinfer") for o in ("NHD", "HND")]
    blocks = {}
    for n, (kind, order) in enumerate(variants):
        src = [_cuda_layout(kind, order, NB, H, T, D, 30 + l) for l in range(L)]
        w = _worker(None, shape, T, src, layout="cuda")
        lay = w._mover.layout
        rows = torch.empty(len(ids), w._mover.block_bytes, dtype=torch.uint8)
        w._mover.save(ids, rows)
        blk = rows.view(torch.bfloat16).view(len(ids), L, 2, H, T, D)
        ok = all(torch.equal(blk[i, l, s], _kv_of(kind, src[l], b)[s])
                 for i, b in enumerate(ids) for l in range(L) for s in (0, 1))
        check(f"{kind} {order}: detected, blocks hold K then V, HND", (lay.kind, lay.order) == (kind, order) and ok,
              (lay.kind, lay.order))
        blocks[(kind, order)] = (rows, src)
    # The block is the same bytes whatever the layout: saved from one, loaded into another.
    rows, src = blocks[("flash_attn", "NHD")]
    dst = [_cuda_layout("flashinfer", "HND", NB, H, T, D, 99) for _ in range(L)]
    _worker(None, shape, T, dst, layout="cuda")._mover.load(rows, [1, 2, 4])
    ok = all(torch.equal(_kv_of("flashinfer", dst[l], a)[s].view(torch.int16),
                         _kv_of("flash_attn", src[l], b)[s].view(torch.int16))
             for l in range(L) for a, b in ((1, 3), (2, 0), (4, 4)) for s in (0, 1))
    check("flash_attn NHD pages -> block -> flashinfer HND pages is bit-exact", ok)

    w = _worker(None, shape, T, [_cuda_layout("flash_attn", "NHD", NB, H, T, D, 1) for _ in range(L)], layout="cuda")
    two = _cuda_layout("flash_attn", "NHD", 2, H, T, D, 2)
    try:
        w._page_kind(two, None)
        ok, msg = False, "no error"
    except P.PagesError as e:
        ok, msg = "cannot tell" in str(e), str(e)
    check("(2, 2, ...) is refused without the backend's name", ok and w._page_kind(two, "flashinfer") == "flashinfer",
          msg)
    # vLLM 0.32's CUDA layout: (NB, H, T, 2D), K and V the halves of each row. The same
    # bytes are another block on the CPU platform (a head's K rows, then its V rows).
    same = cpu_pages(NB, H, T, D, L, 3)
    wc = _worker(None, shape, T, same, layout="cuda")
    rows = torch.empty(len(ids), wc._mover.block_bytes, dtype=torch.uint8)
    wc._mover.save(ids, rows)
    blk = rows.view(torch.bfloat16).view(len(ids), L, 2, H, T, D)
    ok = all(torch.equal(blk[i, l, 0], same[l][b][..., :D]) and torch.equal(blk[i, l, 1], same[l][b][..., D:])
             for i, b in enumerate(ids) for l in range(L))
    rows_cpu = torch.empty_like(rows)
    _worker(None, shape, T, same)._mover.save(ids, rows_cpu)
    check("vLLM 0.32's CUDA layout (num_blocks, H, block_size, 2 * head_dim): kind vllm_cuda, K and V the halves "
          "of each row, and not the CPU platform's block of the same bytes",
          wc._mover.layout.kind == "vllm_cuda" and ok and not torch.equal(rows, rows_cpu), wc._mover.layout.kind)
    ok, msg = raises(lambda: _worker(None, shape, T, [_cuda_layout("flash_attn", "NHD", NB, H, T, D, 1)] * L),
                     ["4 dims"])
    check("CUDA-shaped pages on the CPU platform are refused", ok, msg)

    d = shipped_daemon()
    try:
        tokens = list(range(300, 300 + 3 * T))
        src = [_cuda_layout("flashinfer", "NHD", NB, H, T, D, 40 + l) for l in range(L)]
        s = _worker(E.DaemonLink(d.socket, "unit-cuda"), shape, T, src, layout="cuda")
        s._save(_Transfer("r", None, tokens, 0, [2, 0, 1]))
        dst = [_cuda_layout("flash_attn", "HND", NB, H, T, D, 50 + l) for l in range(L)]
        r = _worker(E.DaemonLink(d.socket, "unit-cuda-r"), shape, T, dst, layout="cuda")
        r._load(_Transfer("r", None, tokens, 0, [4, 3, 0]))
        ok = all(torch.equal(_kv_of("flash_attn", dst[l], a)[si].view(torch.int16),
                             _kv_of("flashinfer", src[l], b)[si].view(torch.int16))
                 for l in range(L) for a, b in ((4, 2), (3, 0), (0, 1)) for si in (0, 1))
        check("through kvtierd: FlashInfer NHD pages saved, FlashAttention HND pages loaded, bit-exact",
              s.saved_blocks == 3 and r.loaded_blocks == 3 and ok, (s.saved_blocks, r.loaded_blocks))
        c = _worker(E.DaemonLink(d.socket, "unit-cuda-cpu"), shape, T, cpu_pages(NB, H, T, D, L, 5))
        c._load(_Transfer("r", None, tokens, 0, [1, 2, 3]))
        check("a CPU engine does not load a CUDA engine's blocks", c.get_block_ids_with_load_errors() == {1, 2, 3})
    finally:
        d.stop()


def main():
    for t in (test_shapes_and_contracts, test_copies, test_link_and_daemon, test_load_errors, test_async_saves,
              test_scheduler_delays_frees, test_last_block, test_load_or_compute, test_fp8_pages, test_cuda_layouts):
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
