"""Split-KV (flash-decoding) path: few query rows per KV head, long Sk.

GPU tests compare with the fp64 reference and SDPA (conftest.check_attention:
2x rule, fp16 allclose 1e-3 against SDPA, LSE) over decode shapes, GQA/MQA,
both causal alignments, every padded head dim, and forced num_splits; then
NaN poisoning of out/lse and of the split workspace, bit-identical reruns and
CUDA-graph replay with new inputs. The C API's workspace and num_splits
checks are called through ctypes on the extension's own symbols. CPU tests
cover the Python argument errors.
"""
import ctypes
import math

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import _C

from conftest import (CAUSAL_MODES, GPU_KERNELS, call, check_attention, dtype_id, make_qkv, mode_id,
                      ref_attention, requires_gpu, run_poisoned)

DEV = "cuda"
DTYPES = [torch.float16, torch.bfloat16]
MODE_IDS = {None: 0, "top_left": 1, "bottom_right": 2}
BC = {64: 64, 128: 64, 256: 32}  # keys per split-KV tile (FC_DECODE_BC)

dtype_param = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
mode_param = pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)


def plan(q, k, v, mode, num_splits=0):
    """Split-KV plan: 0 = tile kernel, n = split-KV kernel with n splits."""
    return _C.num_splits(q, k, v, MODE_IDS[mode], flashcore.KERNELS["auto"], num_splits)


def sid(s):
    return "B{}_Hq{}_Hkv{}_q{}_k{}".format(*s)


# (B, Hq, Hkv, Sq, Sk): decode with GQA 1/4/8 and MQA, odd Sk
DECODE_SHAPES = [
    (2, 8, 8, 1, 1000),     # MHA
    (2, 8, 2, 4, 4097),     # GQA 4
    (1, 16, 2, 16, 1000),   # GQA 8, 128 packed rows: tile kernel unless forced
    (3, 16, 1, 1, 4097),    # MQA, 16 packed rows
    (1, 8, 1, 4, 777),      # MQA, 32 packed rows
    (2, 4, 4, 16, 32768),   # MHA, 16 rows each
    (1, 32, 8, 1, 1),       # one key
    (2, 8, 2, 4, 3),        # fewer keys than query rows' window for top-left
]


@dtype_param
@mode_param
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=sid)
@requires_gpu
def test_decode_auto(shape, D, mode, dtype):
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)


@pytest.mark.parametrize("Sq", [1, 4, 16])
@pytest.mark.parametrize("mode", [None, "bottom_right"], ids=mode_id)
@requires_gpu
def test_decode_128k(Sq, mode):
    q, k, v = make_qkv(1, 32, 8, Sq, 131072, 128, torch.float16, DEV)
    assert plan(q, k, v, mode) > 1, "a 128k decode should split"
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)


FORCED_SHAPES = [(2, 8, 2, 1, 4097), (1, 8, 1, 4, 1000), (2, 4, 4, 16, 2049), (1, 16, 2, 16, 1000)]


@pytest.mark.parametrize("num_splits", [1, 2, 7, 5000])
@mode_param
@dtype_param
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("shape", FORCED_SHAPES, ids=sid)
@requires_gpu
def test_forced_splits(shape, D, dtype, mode, num_splits):
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, DEV)
    n = plan(q, k, v, mode, num_splits)
    visible = Sk if mode != "top_left" else min(Sk, Sq)
    tiles = math.ceil(visible / BC[D])
    if num_splits > 1:
        assert 1 <= n <= min(num_splits, tiles), f"plan {n} for num_splits={num_splits}, {tiles} tiles"
        if num_splits >= tiles:
            assert n == tiles
    out, lse = run_poisoned(q, k, v, mode, num_splits=num_splits)
    check_attention(out, lse, q, k, v, None, mode)


# Forced splits on what FORCED_SHAPES leaves out: unpadded head dims (40, 96, 136,
# 200), odd unequal lengths both ways, and rows for many packed-row blocks.
FORCED_ODD = [((1, 4, 2, 113, 203), 40), ((2, 4, 4, 203, 113), 200), ((1, 2, 1, 1024, 1023), 96),
              ((2, 6, 3, 97, 1000), 136)]


@pytest.mark.parametrize("num_splits", [3, 64])
@mode_param
@dtype_param
@pytest.mark.parametrize("shape,D", FORCED_ODD, ids=lambda x: f"D{x}" if isinstance(x, int) else sid(x))
@requires_gpu
def test_forced_splits_odd(shape, D, dtype, mode, num_splits):
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, DEV)
    assert plan(q, k, v, mode, num_splits) > 1
    out, lse = run_poisoned(q, k, v, mode, num_splits=num_splits)
    check_attention(out, lse, q, k, v, None, mode)


@requires_gpu
@pytest.mark.skipif("sm90" not in GPU_KERNELS, reason="needs the sm90 kernel (an H100/H200)")
def test_forced_sm90_refuses_splits():
    """kernel='sm90' never splits Sk: num_splits > 1 with it is refused by name
    (num_splits=1 runs)."""
    q, k, v = make_qkv(1, 8, 2, 4, 4096, 128, torch.float16, DEV)
    with pytest.raises(ValueError, match=r"num_splits: the sm90 kernel does not split Sk.*kernel='auto'"):
        flashcore.attention(q, k, v, kernel="sm90", num_splits=4)
    out, lse = run_poisoned(q, k, v, None, kernel="sm90", num_splits=1)
    check_attention(out, lse, q, k, v, None, None)


@pytest.mark.parametrize("D,Sq,Sk,Hq", [(256, 48, 40, 1), (256, 12, 40, 4), (128, 80, 72, 1), (64, 20, 72, 4)])
@dtype_param
@requires_gpu
def test_masked_splits_and_rows(D, Sq, Sk, Hq, dtype):
    """bottom-right with Sq > Sk - some keys: the last split is invisible to
    the first rows and the rows i < Sq - Sk see no key at all (O = 0, LSE = -inf)."""
    q, k, v = make_qkv(2, Hq, 1, Sq, Sk, D, dtype, DEV)
    assert plan(q, k, v, "bottom_right", 2) == 2
    out, lse = run_poisoned(q, k, v, "bottom_right", num_splits=2)
    check_attention(out, lse, q, k, v, None, "bottom_right")
    if Sq > Sk:
        assert torch.isneginf(lse[:, :, : Sq - Sk]).all()


# None and bottom-right: at Sq = 3, top-left rows see at most 3 keys, which plans one split (no partials)
@pytest.mark.parametrize("mode", [None, "bottom_right"], ids=mode_id)
@requires_gpu
def test_poisoned_workspace(mode):
    """The combine reads every (split, row) partial: none may be left unwritten. The binding's test switch
    (on for the suite, conftest) fills the partials' workspace with 0xff bytes (NaN) before each launch."""
    q, k, v = make_qkv(2, 16, 2, 3, 5000, 128, torch.float16, DEV)
    assert plan(q, k, v, mode, 9) > 1  # partials to combine
    for _ in range(3):
        out, lse = run_poisoned(q, k, v, mode, num_splits=9)
        check_attention(out, lse, q, k, v, None, mode)


@pytest.mark.parametrize("num_splits", [None, 1, 7])
@requires_gpu
def test_bit_identical_reruns(num_splits):
    q, k, v = make_qkv(4, 32, 8, 1, 8191, 128, torch.bfloat16, DEV)
    out0, lse0 = run_poisoned(q, k, v, "bottom_right", num_splits=num_splits)
    for _ in range(10):
        out, lse = call(q, k, v, "bottom_right", num_splits=num_splits)
        assert torch.equal(out, out0) and torch.equal(lse, lse0)
    check_attention(out0, lse0, q, k, v, None, "bottom_right")


@requires_gpu
def test_matches_sdpa_enable_gqa():
    """fp16 against SDPA's own GQA path (no KV expansion in the test)."""
    q, k, v = make_qkv(8, 32, 8, 1, 4096, 128, torch.float16, DEV)
    assert plan(q, k, v, None) > 1
    out = flashcore.attention(q, k, v, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-3, rtol=1e-3), (out.float() - ref.float()).abs().max().item()


@pytest.mark.parametrize("layout", ["transposed", "sliced_hi", "expanded"])
@requires_gpu
def test_decode_strided(layout):
    q, k, v = make_qkv(2, 8, 2, 4, 3000, 128, torch.float16, DEV, layouts=(layout, layout, layout))
    out, lse = run_poisoned(q, k, v, "bottom_right", num_splits=5)
    check_attention(out, lse, q, k, v, None, "bottom_right")


@pytest.mark.parametrize("num_splits", [None, 6])
@requires_gpu
def test_cuda_graph_replay(num_splits):
    """Capture once; replay after copying new inputs: the plan, the grid and
    the workspace are fixed per shape, the data are read at replay time."""
    B, Hq, Hkv, Sq, Sk, D = 2, 16, 4, 1, 6000, 128
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.float16, DEV)
    assert plan(q, k, v, "bottom_right", num_splits or 0) > 1
    fn = lambda: call(q, k, v, "bottom_right", num_splits=num_splits)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        g_out, g_lse = fn()
    for _ in range(3):
        q2, k2, v2 = make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.float16, DEV)
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        g.replay()
        torch.cuda.synchronize()
        e_out, e_lse = fn()
        assert torch.equal(g_out, e_out) and torch.equal(g_lse, e_lse)
        check_attention(g_out, g_lse, q, k, v, None, "bottom_right")


@requires_gpu
def test_plan_choices():
    """The heuristic splits decode shapes and leaves big prefill to the tile kernel."""
    mk = lambda B, Hq, Hkv, Sq, Sk, D=128: make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.float16, DEV)  # noqa: E731
    assert plan(*mk(8, 32, 8, 1, 32768), None) > 1
    assert plan(*mk(1, 32, 8, 1, 131072), None) > 1
    assert plan(*mk(2, 8, 8, 512, 512, 64), None) == 0          # seed shape: tile kernel
    assert plan(*mk(2, 8, 8, 512, 512, 64), None, 1) == 0       # num_splits=1: still the tile kernel
    assert plan(*mk(2, 8, 8, 512, 512, 64), None, 3) == 3       # forced: split-KV kernel
    assert plan(*mk(1, 32, 8, 1, 1000), "top_left") == 1       # top-left decode sees one key
    assert plan(*mk(1, 32, 8, 1, 4096), None, 1) == 1


# ---------------------------------------------------------------------------
# C API through ctypes: workspace checks


class Params(ctypes.Structure):
    """Mirror of fc_attn_params (csrc/flashcore.h)."""
    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "lse")]
                + [(f"{t}_{s}_stride", ctypes.c_int64) for t in "qkvo" for s in ("batch", "head", "row")]
                + [(n, ctypes.c_int) for n in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype")]
                + [("scale", ctypes.c_float), ("causal", ctypes.c_int), ("kernel", ctypes.c_int),
                   ("num_splits", ctypes.c_int), ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
                   ("counters_zeroed", ctypes.c_int), ("window", ctypes.c_int), ("window_left", ctypes.c_int),
                   ("window_right", ctypes.c_int), ("Dv", ctypes.c_int), ("scale64", ctypes.c_double),
                   ("lse64", ctypes.c_void_p), ("mask", ctypes.c_void_p), ("mask_batch_stride", ctypes.c_int64),
                   ("mask_head_stride", ctypes.c_int64), ("mask_row_stride", ctypes.c_int64),
                   ("mask_kind", ctypes.c_int)])


def _lib():
    lib = ctypes.CDLL(_C.__file__)
    lib.fc_attn_fwd_check.argtypes = [ctypes.POINTER(Params), ctypes.c_char_p, ctypes.c_size_t]
    lib.fc_attn_fwd_check.restype = ctypes.c_int
    lib.fc_attn_fwd.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p]
    lib.fc_attn_fwd.restype = ctypes.c_int
    lib.fc_attn_fwd_workspace_size.argtypes = [ctypes.POINTER(Params)]
    lib.fc_attn_fwd_workspace_size.restype = ctypes.c_size_t
    lib.fc_status_string.argtypes = [ctypes.c_int]
    lib.fc_status_string.restype = ctypes.c_char_p
    return lib


def _params(q, k, v, out, kernel, num_splits):
    p = Params()
    p.q, p.k, p.v, p.o, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None
    for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        for i, s in enumerate(("batch", "head", "row")):
            setattr(p, f"{name}_{s}_stride", t.stride(i))
    p.B, p.Hq, p.Sq, p.D = q.shape
    p.Hkv, p.Sk = k.shape[1], k.shape[2]
    p.dtype = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}[q.dtype]
    p.scale, p.causal, p.kernel, p.num_splits = 1.0 / math.sqrt(q.shape[-1]), 0, kernel, num_splits
    p.scale64 = 1.0 / math.sqrt(q.shape[-1]) if q.dtype == torch.float64 else 0.0
    return p


def test_c_api_status_strings():
    """Every fc_status (flashcore.h) has its own string; a value past the
    last one reads "unknown status". CPU only: the strings are plain C."""
    lib = _lib()
    last = 11  # FC_ERR_HOST_MEMORY, the enum's last value
    names = [lib.fc_status_string(s) for s in range(last + 1)]
    assert names[0] == b"ok" and names[last] == b"out of host memory"
    assert len(set(names)) == last + 1 and b"unknown status" not in names
    assert lib.fc_status_string(last + 1) == b"unknown status"


@requires_gpu
def test_c_api_workspace_checks():
    lib = _lib()
    q, k, v = make_qkv(2, 8, 2, 1, 4096, 128, torch.float16, DEV)
    out = torch.empty_like(q)
    p = _params(q, k, v, out, 0, 4)
    need = lib.fc_attn_fwd_workspace_size(ctypes.byref(p))
    assert need == 4 * 2 * 8 * 1 * 129 * 4
    why = ctypes.create_string_buffer(1024)
    st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
    assert lib.fc_status_string(st) == b"workspace missing or too small"
    assert b"workspace" in why.value and str(need).encode() in why.value
    ws = torch.empty(need, dtype=torch.uint8, device=DEV)
    p.workspace, p.workspace_bytes = ws.data_ptr(), need - 16
    assert lib.fc_attn_fwd(ctypes.byref(p), None) == st  # refused before any launch
    p.workspace_bytes = need
    assert lib.fc_attn_fwd(ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)) == 0
    torch.cuda.synchronize()
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-3, rtol=1e-3)
    p.num_splits = 1
    assert lib.fc_attn_fwd_workspace_size(ctypes.byref(p)) == 0


@requires_gpu
@pytest.mark.skipif("sm90" not in GPU_KERNELS, reason="needs the sm90 kernel (an H100/H200)")
@pytest.mark.parametrize("D,shape", [(128, (4, 16, 1000, 1000)), (256, (4, 16, 1000, 1000)),
                                     (128, (2, 16, 600, 2100)), (64, (4, 32, 550, 2300))], ids=lambda x: str(x))
def test_c_api_tile_counter_workspace(D, shape):
    """Causal sm90 calls at D > 64 with Sk < 2048 and more 128-row tiles than SMs,
    causal D = 128 calls on three consumers from Sk = 2048 (the third shape), and
    causal D = 64 calls with rows of 2048 keys or more, or whose static-order windows
    would not fit the L2 (the fourth),
    take their tiles from a 16-byte counter in the workspace (kernels.h,
    fc_sm90_dynamic_order): sized, refused when missing, zeroed by each launch."""
    lib = _lib()
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    B, H, Sq, Sk = shape
    assert -(-Sq // 128) * B * H > sms
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, torch.float16, DEV)
    out = torch.empty_like(q)
    p = _params(q, k, v, out, 0, 0)
    p.causal = 1  # top-left
    assert lib.fc_attn_fwd_workspace_size(ctypes.byref(p)) == 16
    why = ctypes.create_string_buffer(512)
    st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
    assert lib.fc_status_string(st) == b"workspace missing or too small"
    assert b"tile counter" in why.value
    ws = torch.full((16,), 0xFF, dtype=torch.uint8, device=DEV)  # the launch must zero it
    p.workspace, p.workspace_bytes = ws.data_ptr(), 16
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    outs = []
    for _ in range(2):  # the counter restarts on every launch
        out.fill_(float("nan"))
        assert lib.fc_attn_fwd(ctypes.byref(p), stream) == 0
        torch.cuda.synchronize()
        outs.append(out.clone())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(outs[0], ref, atol=1e-3, rtol=1e-3)
    assert torch.equal(outs[0], outs[1])
    # counters_zeroed: a zero workspace needs no memset, and every call leaves it zero
    p.counters_zeroed = 2
    assert lib.fc_status_string(lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))) == b"invalid argument"
    assert b"counters_zeroed" in why.value
    ws.zero_()
    p.counters_zeroed = 1
    for _ in range(2):
        out.fill_(float("nan"))
        assert lib.fc_attn_fwd(ctypes.byref(p), stream) == 0
        torch.cuda.synchronize()
        assert torch.equal(out, outs[0])
        assert not ws.any()
    p.causal = 0  # the static order: no workspace
    assert lib.fc_attn_fwd_workspace_size(ctypes.byref(p)) == 0


# ---------------------------------------------------------------------------
# CPU: argument errors and the CPU path ignoring num_splits


def _cpu_qkv():
    return (torch.randn(1, 4, 2, 64), torch.randn(1, 2, 33, 64), torch.randn(1, 2, 33, 64))


@pytest.mark.parametrize("bad", [-1, -100])
def test_num_splits_negative(bad):
    with pytest.raises(ValueError, match=r"num_splits.*None or 0"):
        flashcore.attention(*_cpu_qkv(), num_splits=bad)


@pytest.mark.parametrize("bad", [1.5, "4", True])
def test_num_splits_type(bad):
    with pytest.raises(TypeError, match=r"num_splits.*int"):
        flashcore.attention(*_cpu_qkv(), num_splits=bad)


def test_num_splits_numpy_ints():
    """num_splits takes ints as the window's sides do (anything with __index__, numpy's among them), in an
    eager call, through the op (an input that requires grad) and under a dispatch mode; a negative one is
    refused in the same words."""
    from torch.utils.flop_counter import FlopCounterMode
    np = pytest.importorskip("numpy")
    q, k, v = _cpu_qkv()
    base = flashcore.attention(q, k, v, num_splits=2)
    qg = q.detach().requires_grad_(True)
    for n in (np.int64(2), np.int32(2), np.uint8(2)):
        assert torch.equal(flashcore.attention(q, k, v, num_splits=n), base)
        assert torch.equal(flashcore.attention(qg, k, v, num_splits=n).detach(), base)
        with FlopCounterMode(display=False):
            assert torch.equal(flashcore.attention(q, k, v, num_splits=n), base)
    for t in (q, qg):  # (the CPU ignores num_splits: the refusals' values show what the call read)
        for n in (-3, 2 ** 40):
            with pytest.raises(ValueError, match=rf"^num_splits: got {n}; pass None or 0"):
                flashcore.attention(t, k, v, num_splits=np.int64(n))
        with pytest.raises(TypeError, match=r"^num_splits: expected None or an int, got (numpy\.)?float64"):
            flashcore.attention(t, k, v, num_splits=np.float64(2.0))
        for bad in (torch.tensor(2), torch.tensor(2.0), torch.tensor(True)):
            with pytest.raises(TypeError, match=r"^num_splits: expected None or an int, got Tensor"):
                flashcore.attention(t, k, v, num_splits=bad)
        with pytest.raises(ValueError, match=r"^num_splits: got 9223372036854775813; pass None or 0"):
            flashcore.attention(t, k, v, num_splits=np.uint64(2 ** 63 + 5))
        with pytest.raises(TypeError, match=r"^num_splits: BadIndex does not convert to an int") as e:
            flashcore.attention(t, k, v, num_splits=BadIndex())
        assert isinstance(e.value.__cause__, ZeroDivisionError)


class BadIndex:
    """An int-like whose __index__ raises."""

    def __index__(self):
        raise ZeroDivisionError("no index")


def test_num_splits_negative_binding():
    q, k, v = _cpu_qkv()
    with pytest.raises(ValueError, match=r"num_splits"):
        _C.fwd(q, k, v, 0.125, 0, 0, False, -3)
    with pytest.raises(ValueError, match=r"num_splits"):
        _C.num_splits(q, k, v, 0, 0, -3)


def test_c_api_num_splits_negative_cpu():
    lib = _lib()
    q, k, v = _cpu_qkv()
    out = torch.empty_like(q)
    p = _params(q, k, v, out, flashcore.KERNELS["cpu"], -2)
    why = ctypes.create_string_buffer(1024)
    st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
    assert lib.fc_status_string(st) == b"invalid argument"
    assert b"num_splits: -2 is negative" in why.value
    p.num_splits = 3
    assert lib.fc_attn_fwd_check(ctypes.byref(p), None, 0) == 0
    assert lib.fc_attn_fwd_workspace_size(ctypes.byref(p)) == 0  # CPU path: no workspace


def test_c_api_counters_zeroed_cpu():
    """counters_zeroed is 0 or 1; anything else is refused by name, and both
    values leave the CPU path (no workspace) as it was."""
    lib = _lib()
    q, k, v = _cpu_qkv()
    out = torch.empty_like(q)
    p = _params(q, k, v, out, flashcore.KERNELS["cpu"], 0)
    why = ctypes.create_string_buffer(1024)
    for bad in (2, -1):
        p.counters_zeroed = bad
        st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
        assert lib.fc_status_string(st) == b"invalid argument"
        assert f"counters_zeroed: {bad}".encode() in why.value
        assert lib.fc_attn_fwd(ctypes.byref(p), None) == st  # refused before running
    for ok in (0, 1):
        p.counters_zeroed = ok
        out.fill_(float("nan"))
        assert lib.fc_attn_fwd(ctypes.byref(p), None) == 0
        ref, _ = ref_attention(q, k, v)
        assert (out.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_cpu_ignores_num_splits(num_splits):
    q, k, v = _cpu_qkv()
    assert _C.num_splits(q, k, v, 0, 0, num_splits or 0) == 0
    out, lse = flashcore.attention(q, k, v, num_splits=num_splits, return_lse=True)
    ref, ref_lse = ref_attention(q, k, v)
    assert (out.double() - ref).abs().max().item() < 1e-5
    assert (lse.double() - ref_lse).abs().max().item() < 1e-5
