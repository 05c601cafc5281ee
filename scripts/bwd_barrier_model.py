"""bwd_barrier_model.py -- a model of the persistent Hopper backward's protocol (csrc/sm90/attn_bwd_sm90.cuh).

One actor per warpgroup walks the kernel's sequence over a CTA's items (each item: K and V of its
key block, then n_iter query blocks through a ring of two Q/dO slots; items that walk no block
included). The ring runs across items: the last block of an item loads the next item's first block
with its V (dP^T, V's last reader, retires before the block's CTA barrier) and, with two K
buffers (`whole`), its K into the other buffer; with one (`whole1`, `split`) K loads after the
item's end barrier, and after items that walk no block everything does. Modelled: barrier waits,
the CTA's named barriers, TMA loads (issued by warpgroup 0's thread 0), the async reads of its
wgmmas, dS^T (and P^T) stores, dQ staging and the bulk reductions that read it, the next item
passed through shared memory, and the epilogue's dK, dV staged in the last block's slot (and at
DP = 128 dK in the dQ staging) for TMA stores that read them asynchronously. A random scheduler
interleaves the warpgroups; TMA loads land, and bulk reductions finish reading, in any order and
often late. Each run checks:
  - no deadlock;
  - (`whole`) thread 0's wait on a slot's empty barrier before it refills the slot passes at once;
  - every read finds the tile it expects, landed (K, V of its item, the slot of its block, the
    dS^T buffer of its block from both warpgroups);
  - no write (TMA load, dS^T, staging or epilogue store) hits a buffer a wgmma, reduction or TMA
    store still reads;
  - every warpgroup reads the next item its thread 0 wrote, before the word is written again.
mbarrier.try_wait.parity is modelled as in scripts/barrier_model.py (Barrier, shared with it).

    python scripts/bwd_barrier_model.py          # every layout, 2000 schedules each
    python scripts/bwd_barrier_model.py 500 split

Layouts: `whole` (DP = 64, two K buffers, the early refill: each warpgroup arrives on the slot's
empty barrier after its block's last wgmma wait, and thread 0 loads block n + 2 at block n's end if
both have, else at block n + 1's CTA barrier as the others do) and `whole1` (DP = 128, one K
buffer): each warpgroup owns 64 keys; dV and dK from registers read the slot's dO and Q until the
block's last wait; dQ staged in a buffer per warpgroup. `split` (DP = 256: the warpgroups share the
keys; S^T (warpgroup 0) and dP^T (1) read the whole slot and retire before the warpgroups pass each
other half of their columns through an exchange buffer, a named barrier between the stores and the
reads; dV and dK after the CTA barrier read P^T, dS^T (one buffer of each: the exchange's barrier
follows both warpgroups' last reads of the block before) and the half of the slot that warpgroup's
columns live in, and its dQ is staged over that half, as are its dK and dV; under MLA's head dims
warpgroup 1 also stages warpgroup 0's second dQ piece, over slab 3: its own half). Both `whole` layouts
stage dK and dV as DP = 128 does: dV in the warpgroup's tile of the last slot, dK in its dQ staging
(DP = 64 uses the first alone, a subset). Not modelled:
when thread 0 takes the next item from the counter (the model knows each CTA's item list; that the
ticket is taken before the last block's refill reads it is checked by reading the kernel), and the
deterministic mode (one item per CTA). The model follows the kernel; change both together.
"""
import random
import sys

from barrier_model import Barrier, Violation, first_failure

LAYOUTS = ["whole", "whole1", "split"]
SLOW = 0.2  # the share of loads and reductions that finish only when nothing else can move


# Orders the kernel must not use, each of which the model must catch (in the layouts listed): the
# next item passed through one word; the next item's K loaded at the last block's refill into the
# buffer this item reads; the
# ring's refill before the CTA barrier; a staging store without waiting for the last reductions'
# reads; the epilogue's stores without that wait; the epilogue before the item's end barrier (in
# `split` a warpgroup's half of the slot is its own after the last block's barrier); the epilogue
# in the slot the next item's first block loads into; (`whole`) block n + 2 loaded at block n's end
# without testing the slot's empty barrier, a warpgroup's arrival on it before its block's last wgmma
# wait, and the test of the phase before (which a fresh barrier passes); (`split`) the exchange
# without its barrier.
BAD = {"one_next_word": LAYOUTS, "early_kv": LAYOUTS, "early_refill": LAYOUTS, "no_bulk_wait": LAYOUTS,
       "no_epi_wait": LAYOUTS, "early_epi": ["whole", "whole1"],
       "epi_next_slot": LAYOUTS, "unguarded_ahead": ["whole"], "early_release": ["whole"],
       "stale_parity": ["whole"], "no_xchg": ["split"]}


def warpgroup(w, items, layout, bad=None):
    """The sequence of warpgroup w over the CTA's items (n_iter of each). Thread 0 (w == 0) also
    issues the loads. bad: one of BAD instead of the kernel's order."""
    split, next_slots = layout == "split", 1 if bad == "one_next_word" else 2
    kbufs = 2 if layout == "whole" else 1  # K buffers (two at DP = 64 only)
    ahead_ok = layout == "whole"  # DP = 64 refills a slot as soon as both warpgroups arrive on its empty barrier

    def first_block(k, n, kb):
        """Item k's first block (the CTA's block n) with its V, on the slot's barrier; K into
        buffer kb first unless kb is None."""
        if kb is not None:
            yield ("tma", [(("K", kb), k)], ("kbar", kb))
        yield ("tma", [(("V",), k), (("slot", n % 2), n)], ("full", n % 2))

    if w == 0 and items[0]:  # prologue: the first item's K, V and first block
        yield from first_block(0, 0, 0)
    n0, busy = 0, 0
    for k, n_iter in enumerate(items):
        next_busy = k + 1 < len(items) and items[k + 1] > 0  # the next item walks a block
        kb = busy % kbufs
        if n_iter:
            yield ("wait", ("kbar", kb), (busy // kbufs) & 1)
        ahead = {"done": False}  # block it + 1 is loading already
        for it in range(n_iter):
            n, slot, halves = n0 + it, (n0 + it) % 2, [("slot", (n0 + it) % 2, h) for h in (0, 1)]
            d = 0 if split else n % 2  # the dS^T (and P^T) buffer: one at DP = 256
            ds = [("dS", d, h) for h in (0, 1)] + ([("PT", d, h) for h in (0, 1)] if split else [])
            yield ("wait", ("full", slot), (n // 2) & 1)
            yield ("read", ("K", kb), k)     # S^T (and dQ, later) read K
            yield ("read", ("V",), k)        # dP^T reads V
            for r in halves:
                yield ("read", r, n)         # S^T, dP^T read Q and dO; dV, dK (whole) too
            if split:  # dP^T waited for before the barrier: the slot's reads, but this half's dV / dK
                yield ("done", halves[1 - w])
            yield ("done", ("V",))           # dP^T has retired before the barrier
            if split:  # S^T or dP^T columns to the other warpgroup, fp32
                yield ("write", ("X", w), n)
                if bad != "no_xchg":
                    yield ("named",)         # BWD_BAR_XCHG
                yield ("read", ("X", 1 - w), n)
                yield ("done", ("X", 1 - w))
            yield ("write", ("dS", d, w), n)
            if split:
                yield ("write", ("PT", d, w), n)
            if bad != "no_bulk_wait":
                yield ("bulk_wait", w)       # this warpgroup's reductions have read their staging
            refill = []
            if w == 0 and it + 1 < n_iter:  # block n + 1, unless it loads already (`whole`)
                refill = [] if ahead["done"] else [("tma", [(("slot", (n + 1) % 2), n + 1)], ("full", (n + 1) % 2))]
            elif w == 0 and next_busy:  # the last block: the next item's first block, V (and K)
                nkb = kb if bad == "early_kv" else (busy + 1) % kbufs if kbufs > 1 else None
                refill = list(first_block(k + 1, n + 1, nkb))
            if bad == "early_refill":
                yield from refill
            if bad == "early_release":
                yield ("arrive", ("empty", slot))
            yield ("named",)                 # BWD_BAR_CTA
            if bad != "early_refill":
                yield from refill
            ahead = {"done": False}
            for r in ds:
                yield ("read", r, n)         # dQ (and split: dV, dK) read both warpgroups' stores
            for r in ds + [("K", kb)] + halves[w:w + 1] + ([] if split else halves[1 - w:2 - w]):
                yield ("done", r)            # wgmma_wait<0>: this block's reads are over
            stage = halves[w] if split else ("stage", w)
            yield ("write", stage, n)
            if ahead_ok and bad != "early_release":
                yield ("arrive", ("empty", slot))  # after the warpgroup barrier that follows every wait
            yield ("bulk", w, stage)         # the bulk reduction reads the staging, asynchronously
            if ahead_ok and w == 0 and it + 2 < n_iter:  # block n + 2 into this slot if both have arrived
                load = ("tma", [(("slot", slot), n + 2)], ("full", slot))
                if bad == "unguarded_ahead":
                    yield load
                    ahead["done"] = True
                else:
                    parity = ((n // 2) & 1) ^ (1 if bad == "stale_parity" else 0)
                    yield ("try", ("empty", slot), parity, load, ahead)
        last = (n0 + n_iter - (0 if bad == "epi_next_slot" else 1)) % 2  # the last block's slot (or the one before)
        epilogue = [("slot", last, w)] + ([] if split else [("stage", w)])
        if bad == "early_epi":
            yield from epi_stores(w, k, epilogue, bad)
        yield ("next_write" if w == 0 else "nop", k % next_slots, k)
        yield ("named",)                     # the item's end barrier
        yield ("next_read", k % next_slots, k)
        if w == 0 and next_busy and (n_iter == 0 or kbufs == 1):  # what the last block did not load
            nkb = (busy + (1 if n_iter else 0)) % kbufs
            yield ("tma", [(("K", nkb), k + 1)], ("kbar", nkb))
            if n_iter == 0:
                yield from first_block(k + 1, n0, None)
        busy += 1 if n_iter else 0
        n0 += n_iter
        if bad != "early_epi":
            yield from epi_stores(w, k, epilogue, bad)
    yield ("bulk_wait", w)


def epi_stores(w, k, areas, bad):
    """The epilogue of warpgroup w's k-th item: dK, dV stored into its areas, then TMA stores of them."""
    if bad != "no_epi_wait":
        yield ("bulk_wait", w)               # its reductions and last TMA stores have read their areas
    for r in areas:
        yield ("write", r, ("epi", k))
    for r in areas:
        yield ("bulk", w, r)                 # the TMA stores read them, asynchronously


def run(layout, items, seed, bad=None):
    """One random schedule; returns "ok" or "deadlock ..."; raises Violation on a bad read or write."""
    rnd = random.Random(seed)
    bars = {("kbar", 0): Barrier(1), ("kbar", 1): Barrier(1), ("full", 0): Barrier(1), ("full", 1): Barrier(1),
            ("empty", 0): Barrier(2), ("empty", 1): Barrier(2)}
    actors = {w: warpgroup(w, items, layout, bad) for w in (0, 1)}
    cur = {a: next(g, None) for a, g in actors.items()}
    content, readers, loads, reductions = {}, {}, [], []
    words = {}  # next-item word -> (item it holds, warpgroups yet to read it)

    def res(r):  # ("slot", s) stands for both halves of the slot
        return [("slot", r[1], 0), ("slot", r[1], 1)] if r[0] == "slot" and len(r) == 2 else [r]

    def write(r, tag, who):
        for x in res(r):
            if readers.get(x):
                raise Violation(f"{who} writes {x} (for {tag}) while {sorted(map(str, readers[x]))} read it")
            if any(x in res(lr) for pairs, _, _ in loads for lr, _ in pairs):
                raise Violation(f"{who} writes {x} (for {tag}) while a TMA load fills it")

    def tma(op):  # one arrival for (resource, tag) pairs that complete together
        _, pairs, bar = op
        for r, tag in pairs:
            # `whole`: before it loads block n >= 2 into a slot, thread 0 waits on the slot's empty barrier
            # for block n - 2's release; the kernel counts on that wait passing at once.
            if layout == "whole" and r[0] == "slot" and len(r) == 2 and tag >= 2 \
                    and not bars[("empty", r[1])].passes((tag // 2 + 1) & 1):
                raise Violation(f"the load of block {tag} would wait on block {tag - 2}'s release")
            write(r, tag, "TMA")
            for x in res(r):
                content[x] = (tag, False)
        bars[bar].arrive(1, tx=1)
        loads.append((pairs, bar, rnd.random() < SLOW))

    def runnable(a):
        op = cur[a]
        if op is None:
            return False
        if op[0] == "wait":
            return bars[op[1]].passes(op[2])
        if op[0] == "named":
            return all(o is not None and o[0] == "named" for o in cur.values())
        if op[0] == "bulk_wait":
            return not any(w == op[1] for w, _, _ in reductions)
        return True

    while True:
        choices = [a for a in cur if runnable(a)]
        if not choices and not loads and not reductions:
            if all(op is None for op in cur.values()):
                return "ok"
            return "deadlock " + str({a: op for a, op in cur.items() if op is not None})
        # A load lands or a reduction's read ends: a slow one (a fifth of them) only once no
        # warpgroup can move, the others at random moments.
        pending = [i for i, p in enumerate(loads + reductions) if not p[-1] or not choices]
        if pending and (not choices or rnd.random() < 0.3):
            i = rnd.choice(pending)
            if i < len(loads):
                pairs, bar, _ = loads.pop(i)
                for r, tag in pairs:
                    for x in res(r):
                        content[x] = (tag, True)
                bars[bar].complete_tx()
            else:
                w, r, _ = reductions.pop(i - len(loads))
                readers[r].discard(("R", w))
            continue
        a = rnd.choice(choices)
        op = cur[a]
        if op[0] == "tma":
            tma(op)
        elif op[0] == "try":  # mbarrier.test_wait: the load if the phase has completed, else nothing
            _, bar, parity, load, state = op
            if bars[bar].passes(parity):
                tma(load)
                state["done"] = True
        elif op[0] == "arrive":
            bars[op[1]].arrive(1)
        elif op[0] == "read":
            _, r, tag = op
            if content.get(r) != (tag, True):
                raise Violation(f"WG{a} reads {r} for {tag}, which holds {content.get(r)}")
            readers.setdefault(r, set()).add(a)
        elif op[0] == "done":
            readers.get(op[1], set()).discard(a)
        elif op[0] == "write":
            write(op[1], op[2], f"WG{a}")
            content[op[1]] = (op[2], True)
        elif op[0] == "bulk":
            readers.setdefault(op[2], set()).add(("R", op[1]))
            reductions.append((op[1], op[2], rnd.random() < SLOW))
        elif op[0] == "next_write":
            if words.get(op[1], (None, set()))[1]:
                raise Violation(f"next-item word {op[1]} written for item {op[2]} before "
                                f"{sorted(words[op[1]][1])} read item {words[op[1]][0]}'s")
            words[op[1]] = (op[2], {0, 1})
        elif op[0] == "next_read":
            held, left = words.get(op[1], (None, set()))
            if held != op[2] or a not in left:
                raise Violation(f"WG{a} reads next-item word {op[1]} for item {op[2]}, which holds item {held}")
            left.discard(a)
        elif op[0] == "nop":
            pass
        elif op[0] == "named":  # both are here (runnable): let both through
            cur[1 - a] = next(actors[1 - a], None)
        cur[a] = next(actors[a], None)


def check(layout, schedules, seed0=0, bad=None):
    """Runs `schedules` random schedules on random item lists; returns the first failure or None."""
    def case(seed, r):
        items = [r.choice([0, 0, 1, 1, 2, 3, 4]) for _ in range(r.randint(1, 6))]
        return f"{layout} items={items}", lambda: run(layout, items, seed, bad)
    return first_failure(schedules, seed0, case)


def main(argv):
    schedules = int(argv[1]) if len(argv) > 1 else 2000
    failed = False
    for layout in argv[2:3] or LAYOUTS:
        result = check(layout, schedules)
        print(f"{layout:6s}: {result or 'ok'}")
        failed |= result is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
