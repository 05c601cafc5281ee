"""barrier_model.py -- a model of the Hopper kernel's mbarrier protocol (csrc/sm90/attn_fwd_sm90.cuh).

One actor per warpgroup (the producer thread, two or three consumer warpgroups) runs the kernel's sequence
of barrier waits, arrivals, TMA loads and shared-memory reads; a random scheduler interleaves
them, and TMA loads land in any order, sometimes much later than issued. Each run checks:
  - no deadlock (some actor can always move until all are done);
  - every read of a Q/K/V slot finds the tile it expects, landed;
  - no TMA load writes a slot while a warpgroup is reading it.
mbarrier.try_wait.parity is modelled exactly: it passes when the barrier's current phase has the
other parity, so a wait that skips a phase can pass too early, as on the GPU.

    python scripts/barrier_model.py            # every mode the kernel uses, 2000 schedules each
    python scripts/barrier_model.py 500 split 3 2    # one mode: schedules, mode, K/V stages, Q buffers
    python scripts/barrier_model.py 500 inorder 3 2 3  # ... and consumer warpgroups (default 2)

Modes: `overlap` (ordinary mode, S(j+1) and P(j)V issued together), `inorder` (ordinary mode,
P(j)V then S(j+1)), `split` (key-split mode: the two warpgroups take alternate K/V tiles, one
consumer per tile). With one Q buffer (D = 256, Sm90Tile::EARLY_Q) an ordinary-mode consumer
releases Q as soon as the tile's last S is done, before its last P V; otherwise at the tile's end.
With one Q buffer each consumer's rows also load and are released on a barrier pair of their own
(Sm90Tile::Q_HALVES): the producer issues the first consumer's rows before the tile's K/V tiles and
the second's after the first K/V tile; and in some tiles the first consumer runs one K/V tile fewer
and releases the last one unread (causal WG_SKIP). The model follows the kernel; change both together.
"""
import random
import sys

# (mode, K/V stages, Q buffers, consumer warpgroups) of every kernel instantiation: D = 64 with
# two and three consumers, 128 with two and three, 256 ordinary, then key-split at D = 64 and 128.
KERNEL_CONFIGS = [("inorder", 3, 2, 2), ("inorder", 3, 2, 3), ("overlap", 2, 2, 2), ("inorder", 2, 2, 3),
                  ("overlap", 2, 1, 2), ("split", 4, 2, 2), ("split", 2, 2, 2)]


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, n=1, tx=0):
        self.pending -= n
        self.tx += tx
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._maybe_complete()

    def complete_tx(self):
        self.tx -= 1
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passes(self, parity):
        return (self.phase & 1) != parity


class Violation(Exception):
    pass


def producer(tiles, stages, qbufs, halves=False, late_half=False):
    """late_half: the second consumer's Q rows issued after all of the tile's K/V tiles (a bad order)."""
    it = 0
    for local, n in enumerate(tiles):
        qb = local % qbufs

        def load_q(part):
            bar = part if halves else qb
            yield ("wait", ("q_empty", bar), ((local // qbufs) & 1) ^ 1)
            yield ("tma", "Q", (qb, part) if halves else qb, local, ("q_full", bar))

        yield from load_q(0)
        for j in range(n):
            st, free = it % stages, ((it // stages) & 1) ^ 1
            yield ("wait", ("k_empty", st), free)
            yield ("tma", "K", st, it, ("k_full", st))
            yield ("wait", ("v_empty", st), free)
            yield ("tma", "V", st, it, ("v_full", st))
            it += 1
            if halves and j == 0 and not late_half:
                yield from load_q(1)
        if halves and (n == 0 or late_half):
            yield from load_q(1)


def consumer(cw, mode, tiles, stages, qbufs, skips=None):
    """skips[i]: in tile i the first consumer runs one K/V tile fewer (WG_SKIP; one-Q-buffer kernels)."""
    split = mode == "split"
    early_q = qbufs == 1 and not split  # Sm90Tile::EARLY_Q (and Q_HALVES)
    step, first = (2, cw) if split else (1, 0)
    it = base = 0

    def read(kind, g):  # wait for position g of the ring, read it, release it
        st = g % stages
        yield ("wait", ("k_full" if kind == "K" else "v_full", st), (g // stages) & 1)
        yield ("read", kind, st, g)
        yield ("done", kind, st)
        yield ("arrive", ("k_empty" if kind == "K" else "v_empty", st), 128)

    for local, n_tile in enumerate(tiles):
        qb = local % qbufs
        qbar, qslot = (cw, (qb, cw)) if early_q else (qb, qb)  # Q_HALVES: this consumer's rows
        n = n_tile - 1 if early_q and cw == 0 and skips and skips[local] and n_tile > 0 else n_tile
        yield ("wait", ("q_full", qbar), (local // qbufs) & 1)
        yield ("read", "Q", qslot, local)
        pos = (lambda j: base + j) if split else (lambda j: it + (j - first))
        j = first
        # Every S = Q K^T reads Q again. Modelled only where Q is released before the tile's end
        # (EARLY_Q); elsewhere the first read's window already spans every S.
        s_reads_q = [("read", "Q", qslot, local)] if early_q else []
        if first < n:
            yield from s_reads_q
            yield from read("K", pos(first))
            while j + step < n:
                g, gn = pos(j), pos(j + step)
                if mode == "overlap":  # both groups in flight; K(next) done first, then V
                    st, sn = g % stages, gn % stages
                    yield ("wait", ("k_full", sn), (gn // stages) & 1)
                    yield from s_reads_q
                    yield ("read", "K", sn, gn)
                    yield ("wait", ("v_full", st), (g // stages) & 1)
                    yield ("read", "V", st, g)
                    yield ("done", "K", sn)
                    yield ("arrive", ("k_empty", sn), 128)
                    yield ("done", "V", st)
                    yield ("arrive", ("v_empty", st), 128)
                else:
                    yield from read("V", g)
                    yield from s_reads_q
                    yield from read("K", gn)
                j += step
            if early_q:  # every S of the tile is done: Q may be overwritten during the last P V
                yield ("done", "Q", qslot)
                yield ("arrive", ("q_empty", qbar), 128)
            yield from read("V", pos(j))
        for jj in range(n, n_tile):  # WG_SKIP: K/V tiles this consumer's rows do not see, released unread
            g = it + jj
            st = g % stages
            yield ("wait", ("k_full", st), (g // stages) & 1)
            yield ("arrive", ("k_empty", st), 128)
            yield ("wait", ("v_full", st), (g // stages) & 1)
            yield ("arrive", ("v_empty", st), 128)
        if split:
            base += n
            yield ("named", 3 + cw)  # the merge's two named barriers: both warpgroups finish the tile
        else:
            it += n_tile
        if not (early_q and first < n):
            yield ("done", "Q", qslot)
            yield ("arrive", ("q_empty", qbar), 128)


def run(mode, stages, qbufs, tiles, seed, consumers=2, skips=None, late_half=False):
    """One random schedule; returns "ok" or "deadlock ..."; raises Violation on a bad read/write."""
    assert mode != "split" or consumers == 2, "key-split mode has two consumers"
    rnd = random.Random(seed)
    per_tile = 128 if mode == "split" else 128 * consumers  # consumer arrivals that free a K or V slot
    halves = qbufs == 1 and mode != "split"  # Sm90Tile::Q_HALVES
    assert not halves or consumers == 2, "Q halves: two consumers"
    bars = {}
    for i in range(consumers if halves else qbufs):
        bars["q_full", i], bars["q_empty", i] = Barrier(1), Barrier(128 * (1 if halves else consumers))
    for i in range(stages):
        bars["k_full", i], bars["v_full", i] = Barrier(1), Barrier(1)
        bars["k_empty", i], bars["v_empty", i] = Barrier(per_tile), Barrier(per_tile)
    actors = {"P": producer(tiles, stages, qbufs, halves, late_half)}
    for cw in range(consumers):
        actors["C%d" % cw] = consumer(cw, mode, tiles, stages, qbufs, skips)
    cur = {a: next(g, None) for a, g in actors.items()}
    content, readers, inflight = {}, {}, []
    named_count = [0]  # warpgroups waiting at the merge barrier of the current tile

    def runnable(a):
        op = cur[a]
        if op is None:
            return False
        if op[0] == "wait":
            return bars[op[1]].passes(op[2])
        if op[0] == "named":  # the merge: both consumers must reach it
            return sum(1 for o in cur.values() if o is not None and o[0] == "named") == 2
        return True

    while True:
        choices = [a for a in cur if runnable(a)]
        if not choices and not inflight:
            if all(op is None for op in cur.values()):
                return "ok"
            return "deadlock " + str({a: op for a, op in cur.items() if op is not None})
        if inflight and (not choices or rnd.random() < 0.3):  # a load lands, often late
            kind, st, g, bar = inflight.pop(rnd.randrange(len(inflight)))
            content[kind, st] = (g, True)
            bars[bar].complete_tx()
            continue
        a = rnd.choice(choices)
        op = cur[a]
        if op[0] == "tma":
            _, kind, st, g, bar = op
            if readers.get((kind, st)):
                raise Violation(f"TMA load of {kind}{g} into slot {st} while {sorted(readers[kind, st])} read it")
            content[kind, st] = (g, False)
            bars[bar].arrive(1, tx=1)
            inflight.append((kind, st, g, bar))
        elif op[0] == "read":
            _, kind, st, g = op
            if content.get((kind, st)) != (g, True):
                raise Violation(f"{a} reads {kind} slot {st} for tile {g}, which holds {content.get((kind, st))}")
            readers.setdefault((kind, st), set()).add(a)
        elif op[0] == "done":
            readers[op[1], op[2]].discard(a)
        elif op[0] == "arrive":
            bars[op[1]].arrive(op[2])
        elif op[0] == "named":  # both are here (runnable); let both through
            for b in cur:
                if cur[b] is not None and cur[b][0] == "named" and b != a:
                    cur[b] = next(actors[b], None)
        cur[a] = next(actors[a], None)


def first_failure(schedules, seed0, case):
    """case(seed, rnd) -> (label, run thunk) for one schedule, rnd drawing its inputs; returns the
    first schedule's failure ("<label> seed=<seed>: <deadlock or violation>") or None."""
    for seed in range(seed0, seed0 + schedules):
        label, thunk = case(seed, random.Random(seed * 7 + 1))
        try:
            res = thunk()
        except Violation as e:
            res = "violation: " + str(e)
        if res != "ok":
            return f"{label} seed={seed}: {res}"
    return None


def check(mode, stages, qbufs, schedules, seed0=0, consumers=2, late_half=False):
    """Runs `schedules` random schedules on random tile lists; returns the first failure or None."""
    def case(seed, r):
        tiles = [r.choice([0, 1, 1, 2, 3, 4, 5, 6, 7]) for _ in range(r.randint(1, 5))]
        skips = [r.random() < 0.5 for _ in tiles]
        return (f"{mode} stages={stages} qbufs={qbufs} consumers={consumers} tiles={tiles}",
                lambda: run(mode, stages, qbufs, tiles, seed, consumers, skips, late_half))
    return first_failure(schedules, seed0, case)


def main(argv):
    schedules = int(argv[1]) if len(argv) > 1 else 2000
    configs = ([(argv[2], int(argv[3]), int(argv[4]), int(argv[5]) if len(argv) > 5 else 2)]
               if len(argv) > 4 else KERNEL_CONFIGS)
    failed = False
    for mode, stages, qbufs, consumers in configs:
        res = check(mode, stages, qbufs, schedules, consumers=consumers)
        print(f"{mode:8s} stages={stages} qbufs={qbufs} consumers={consumers}: {res or 'ok'}")
        failed |= res is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
