"""flashcore: fused attention for PyTorch (forward and backward), with a thin C core.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)
    out = flashcore.attention(q, k, v, causal=True, window=(4095, 0))  # sliding window

``flashcore.attention`` is a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` without dropout (its attn_mask
runs on the CPU so far).
It also works under ``torch.compile`` (``fullgraph=True`` included): there it
runs as the custom op ``torch.ops.flashcore.attention``.
"""
import math
import operator
from typing import List, Optional, Tuple

import torch
from torch._guards import TracingContext
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.flop_counter import register_flop_formula

from . import _C

__all__ = ["attention", "KERNELS", "CAUSAL_ALIGNMENTS"]
__version__ = "0.1.0"  # (pyproject.toml and setup.py carry the same; tests/test_setup.py checks)

# Name -> id of fc_kernel and fc_causal (csrc/flashcore.h): the binding's own
# tables, the ones flashcore.attention parses its string options with.
KERNELS = dict(_C.KERNELS)
CAUSAL_ALIGNMENTS = dict(_C.CAUSAL_ALIGNMENTS)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, *, causal=None, causal_alignment="top_left", return_lse=False,
              kernel="auto", num_splits=None, window=None):
    # Eager calls go straight to the binding, which does all the argument
    # handling in C++ (per-call host time is the point). What only torch's
    # dispatcher can run is the custom op below (the same binding at run time,
    # output shapes from _attention_fake): a torch.compile trace (which cannot
    # enter a C++ function), and the calls the binding hands back as
    # NotImplemented (torch.jit.trace, tensor subclasses, vmap and other
    # functorch transforms, meta tensors).
    if not torch.compiler.is_compiling():
        r = _C.attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal,
                         causal_alignment, return_lse, kernel, num_splits, window)
        if r is not NotImplemented:
            return r
    flipped = _flip_scale(query, scale)
    if flipped is not None:
        q, scale = flipped
        return attention(q, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal=causal,
                         causal_alignment=causal_alignment, return_lse=return_lse, kernel=kernel,
                         num_splits=num_splits, window=window)
    # SDPA's calls that are not one (B, H, S, D) call run as one, rewritten: v's own head dim padded first
    # (so that a broadcast input is padded once, not per batch entry or head), then the shapes folded;
    # unless the kernel runs v's own head dim (an eager call with grad: the op takes it as it is).
    own_dv = _own_dv_op(query, key, value, is_causal, causal, causal_alignment, kernel, num_splits, window)
    rewrite = None if own_dv else _pad_head_dims(query, key, value, scale) or _as_bhsd(query, key, value, scale,
                                                                                      attn_mask)
    if rewrite is not None:
        q, k, v, scale, back = rewrite
        r = attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal=causal,
                      causal_alignment=causal_alignment, return_lse=return_lse, kernel=kernel,
                      num_splits=num_splits, window=window)
        out, lse = back(*(r if return_lse else (r, None)))
        return (out, lse) if return_lse else out
    dropout_p, scale, num_splits, window = _check_arg_types(attn_mask, dropout_p, is_causal, scale, enable_gqa, causal,
                                                causal_alignment, return_lse, kernel, num_splits, window)
    grad = _needs_grad(query, key, value, kernel)
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError("attn_mask: requires grad, but flashcore has no gradient for the mask; pass "
                         "attn_mask.detach()")
    # (the mask cast here too, not only in the binding: the op saves the mask it ran with)
    query, key, value, attn_mask = _autocast(query, key, value, attn_mask)
    # With grad the op always returns the LSE: the backward reads it.
    out, lse = _attention_op(query, key, value, attn_mask, dropout_p, is_causal, scale, causal,
                             causal_alignment, return_lse or grad, kernel, num_splits, window)
    return (out, lse) if return_lse else out


attention.__doc__ = _C.ATTENTION_DOC


# (float)x > 0 in fp32 iff x > 2^-150 (half of fp32's smallest subnormal rounds to even, 0): with
# _C.MAX_SCALE the kernels' scale range (binding.cpp's scale_ok), for _flip_scale.
_FP32_ROUNDS_TO_ZERO = 2.0 ** -150


def _flip_scale(query, scale):
    # SDPA takes a scale <= 0; the kernels take scale > 0 (their softmax subtracts a row's largest score
    # before scaling). softmax(s q k^T) at s < 0 is the call with -q at -s, and at s = 0 the call with
    # q * 0 at 1 (a NaN or inf in q still makes its row NaN, as s * (q . k) does): exact, for the cost of
    # q's copy; autograd runs through the negation. Returns (q, scale), or None (scale None, > 0, NaN, a
    # magnitude the kernels do not take, or not a number: the call refuses those).
    if not isinstance(query, torch.Tensor) or scale is None or isinstance(scale, (bool, str, torch.Tensor)) \
            or _is_numpy_bool(scale):
        return None
    if torch.compiler.is_compiling() and not isinstance(scale, (int, float)):
        return None  # (a numpy float32 that dynamo holds as data: comparing it would guard on data)
    try:
        s = float(scale)
    except (TypeError, ValueError, OverflowError):
        return None
    if s == 0:
        return query * 0.0, 1.0
    if s < 0 and _FP32_ROUNDS_TO_ZERO < -s <= _C.MAX_SCALE:
        return -query, -s
    return None


def _as_bhsd(query, key, value, scale, attn_mask=None):
    # SDPA's shapes beyond one (B, H, S, D) call: q (..., Sq, D), k and v
    # (..., Sk, D), each of rank >= 2, with dim -3 (where there is one) the
    # heads and the dims before it batch dims, broadcast against each other as
    # SDPA broadcasts them (a dim of 1 against any size); a single query head
    # against k's heads, and k's and v's heads against each other. Returns
    # (q, k, v) as (B, H, S, D) views, scale, and back(out, lse), which gives
    # out and lse (or None) the call's shapes; or None where the inputs are
    # already one such call (binding.cpp's bhsd_call) or are not strided
    # tensors (the call refuses them). Broadcast dims that a (B, H, S, D) view
    # cannot express are copied (reshape), as SDPA's math backend expands them.
    ts = (query, key, value)
    if not _strided(ts) or _one_call(*ts):
        return None
    if attn_mask is not None:
        raise ValueError(f"attn_mask: taken so far with q, k, v of one (B, H, S, D) call (4-D, one batch size, "
                         f"k's and v's heads dividing q's), got shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}; expand or reshape them to such a call, the mask broadcasting to "
                         f"(B, Hq, Sq, Sk)")
    for name, t in zip("qkv", ts):
        if t.dim() < 2:
            raise ValueError(f"{name}: expected a tensor of at least 2 dims (..., S, D), got {t.dim()}-D of shape "
                             f"{tuple(t.shape)}; add the missing dims with unsqueeze or reshape")
    _refuse_hidden_views(ts, neg=False)  # (a copy in the fold would hide a strided last dim)
    rank = max(3, *(t.dim() for t in ts))
    shapes = [(1,) * (rank - t.dim()) + tuple(t.shape) for t in ts]
    batch = shapes[0][:-3]
    for name, t, s in (("k", key, shapes[1]), ("v", value, shapes[2])):
        if any(a != b and a != 1 and b != 1 for a, b in zip(batch, s[:-3])):
            raise ValueError(f"{name}: the batch dims (all but the last three) of shape {tuple(t.shape)} do not "
                             f"broadcast with q's {tuple(query.shape)}" + ("" if name == "k" else
                             f" and k's {tuple(key.shape)}") + "; use equal batch dims, or 1 where one is shared")
        batch = tuple(b if a == 1 else a for a, b in zip(batch, s[:-3]))
    hq, hk, hv = (s[-3] for s in shapes)
    if hk != hv and hk != 1 and hv != 1:
        raise ValueError(f"v: {hv} heads but k has {hk}; k and v need the same number of heads (or one of them 1, "
                         f"broadcast)")
    hk = hv if hk == 1 else hk
    hq = hk if hq == 1 else hq  # (a single query head against k's, as SDPA broadcasts it)
    # (a dim broadcast from 1 stays a stride-0 view where one batch dim holds it; the kernels read such views)
    views = [t.expand(*batch, h, *s[-2:]).reshape(math.prod(batch), h, *s[-2:])
             for t, s, h in zip(ts, shapes, (hq, hk, hk))]
    shape = (*batch, hq, query.shape[-2], value.shape[-1]) if max(t.dim() for t in ts) >= 3 else \
        (query.shape[-2], value.shape[-1])
    return (*views, scale, lambda out, lse: (out.reshape(shape), None if lse is None else lse.reshape(shape[:-1])))


def _pad_head_dims(query, key, value, scale):
    # v's head dim Dv may differ from q's and k's D, and D need not be a multiple
    # of 8, as in SDPA (out then has Dv columns): the call runs at Dp = max(D, Dv)
    # rounded up to 8 with zero columns appended (to q and k where Dp > D, which
    # leaves every q . k as it is; to v where Dp > Dv, whose output columns are
    # cut off), at D's scale. Any rank: the padding precedes _as_bhsd's fold.
    # Exact, at the cost of the padded copies and the wider call. Returns
    # (q, k, v) padded, the scale and back(out, lse), which cuts out to Dv
    # columns; or None where Dv == D and D is a multiple of 8 (or out of range:
    # the call refuses it), or an input is not a strided tensor of rank >= 1.
    ts = (query, key, value)
    if not _strided(ts) or any(t.dim() < 1 for t in ts):
        return None
    d, dv = query.shape[-1], value.shape[-1]
    if dv == d and (d % 8 == 0 or not 1 <= d < _C.MAX_HEAD_DIM):
        return None
    if key.shape[-1] != d:
        raise ValueError(f"k: head dim {key.shape[-1]} differs from q's {d}; q and k need the same D (v's may differ)")
    if d < 1 or d > _C.MAX_HEAD_DIM:
        raise ValueError(f"q: head dim D={d} is not supported; D must be from 1 to {_C.MAX_HEAD_DIM}")
    _refuse_hidden_views(ts, neg=True)  # (the padded copy would hide them)
    if dv > _C.MAX_HEAD_DIM:
        raise ValueError(f"v: head dim {dv} exceeds {_C.MAX_HEAD_DIM}, the widest flashcore takes; split v's columns "
                         f"into calls of at most {_C.MAX_HEAD_DIM}")
    dp = -(-max(d, dv) // 8) * 8
    return (*(_pad_cols(t, dp) for t in ts), 1.0 / math.sqrt(d) if scale is None else scale,
            lambda out, lse: (out[..., :dv].contiguous(), lse))


def _own_dv_op(query, key, value, is_causal, causal, causal_alignment, kernel, num_splits, window):
    # Whether an eager call the binding handed back (one that records autograd) runs on the op with v's own
    # head dim: one (B, H, S, D) call of plain tensors whose kernel takes Dv != D as it is (_C.native_dv:
    # the CPU path, the sm90 kernel at D > 128; meta tensors as the CPU). Never while torch.compile traces
    # (the fake tensors have no data to check; the padded call is traced) or for tensors only the
    # dispatcher runs (vmap, subclasses). Arguments the call refuses give False here, and the padded call
    # raises for them (a meta call: the op's meta kernel).
    ts = (query, key, value)
    if not _plain_eager(ts) or not _strided(ts):
        return False
    if not all(t.dim() == 4 for t in ts) or value.shape[3] == query.shape[3] or \
            not _one_call(query, key, value, any_dv=True):
        return False
    try:
        mode, win = _C.causal_window(is_causal if causal is None else causal, causal_alignment, window)
        q, k, v = _autocast(query, key, value)
        return bool(_C.native_dv(q, k, v, mode, KERNELS[kernel], num_splits or 0, None if win is None else list(win)))
    except (TypeError, ValueError, KeyError, RuntimeError):  # (RuntimeError: a wrapper's data, under vmap)
        return False


def _plain_eager(ts):
    # Plain tensors outside a torch.compile trace: what the binding's native_dv checks read (meta ones
    # included: they answer as the CPU).
    return not torch.compiler.is_compiling() and all(type(t) is torch.Tensor for t in ts)


def _strided(ts):
    # Tensors the rewrites of SDPA's other calls apply to (others go on to the call, which refuses them).
    return all(isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_nested for t in ts)


def _refuse_hidden_views(ts, neg):
    # What the binding refuses in q, k and v (a last dim with stride != 1, and with neg a negated view),
    # refused before a rewrite's copy would hide it. (A last dim of one element has no stride to speak of;
    # dynamo cannot trace is_neg, so a traced call leaves that to the op.)
    for name, t in zip("qkv", ts):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got stride {t.stride(-1)}; call "
                             f"{name}.contiguous()")
        if neg and not torch.compiler.is_compiling() and t.is_neg():
            raise ValueError(f"{name}: is a negated view; call {name}.resolve_neg()")


def _one_call(query, key, value, any_dv=False, traced=False):
    # binding.cpp's bhsd_call for strided tensors: already one (B, H, S, D) call
    # (any_dv: v's head dim not compared, a call _own_dv_op may run as it is).
    # While torch.compile or torch.export traces (or traced: the op's fake
    # tensors), a 4-D call counts as one unless its sizes are known to differ
    # without a guard (a guard on sizes that are unbacked, or exported as
    # independent, would fail the trace): the op's run-time checks refuse the
    # calls that are not one.
    if not all(t.dim() == 4 for t in (query, key, value)):
        return False
    (bq, hq), (bk, hk), (bv, hv) = (t.shape[:2] for t in (query, key, value))
    known = statically_known_true if traced or torch.compiler.is_compiling() else bool
    return not (known(bk != bq) or known(bv != bq) or known(hk != hv) or (known(hq == 1) and known(hk != 1)) or
                (not any_dv and known(value.shape[3] != query.shape[3])))


def _needs_grad(query, key, value, kernel):
    # Whether autograd records this call (an input requires grad). The GPU
    # backward covers every head dim the forward takes (_C.BWD_MAX_GPU_HEAD_DIM),
    # the portable one above 128 only on GPUs with its shared memory per block;
    # what the GPU cannot run is refused here, before the forward runs, rather
    # than in backward() (not while torch.compile traces: the backward refuses
    # it there).
    _refuse_transforms(query, key, value)
    if not torch.is_grad_enabled():
        return False
    names = [n for n, t in (("q", query), ("k", key), ("v", value)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if names and isinstance(query, torch.Tensor) and query.is_cuda and query.dim() == 4:
        D = query.shape[-1]
        if kernel in ("auto", "sm80", "sm90") and 0 < D <= _C.BWD_MAX_GPU_HEAD_DIM and \
                not torch.compiler.is_compiling():
            why = _C.bwd_device_check(D, KERNELS[kernel], query.device.index)
            if why:
                raise ValueError(f"{why} ({names[0]} requires grad: the backward could not run; call it under "
                                 f"torch.no_grad() for inference)")
    return bool(names)


def _refuse_transforms(query, key, value):
    # What the op has no formula for, refused rather than dropped: a
    # forward-mode tangent (torch.func.jvp, jacfwd, forward_ad: the op has no
    # jvp, and torch would return zero tangents), and gradients under
    # torch.func's grad transform (grad, vjp, jacrev: the autograd formula
    # serves torch.autograd only). Plain tensors outside any transform pass.
    # (Not while torch.compile traces: dynamo cannot trace the interpreter stack.)
    if torch.compiler.is_compiling():
        return
    stack = torch._C._functorch.get_interpreter_stack()
    grad_level = any(i.key() == torch._C._functorch.TransformType.Grad for i in stack) if stack else False
    for name, t in (("q", query), ("k", key), ("v", value)):
        if not isinstance(t, torch.Tensor):
            continue
        if torch.autograd.forward_ad.unpack_dual(t).tangent is not None:
            raise ValueError(f"{name}: carries a forward-mode AD tangent (torch.func.jvp, jacfwd or "
                             f"torch.autograd.forward_ad), but flashcore.attention has no forward-mode derivative "
                             f"(no jvp); use scaled_dot_product_attention for forward-mode AD")
        if grad_level and t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{name}: requires grad under a torch.func transform (grad, vjp, jacrev), but "
                             f"flashcore's backward runs under torch.autograd only; use torch.autograd.grad or "
                             f"loss.backward(), or scaled_dot_product_attention under torch.func")


def _autocast(query, *others):
    # binding.cpp's autocast_inputs (and mask_arg's cast of a float mask) for the op path: under
    # torch.autocast, floating tensors other than fp64 on q's device take the autocast dtype, as SDPA's
    # do. Returns (query, *others), cast; a None among others stays None.
    ts = (query, *others)
    if not isinstance(query, torch.Tensor):
        return ts  # (the op refuses it with the binding's TypeError)
    dev = query.device.type
    if dev not in ("cuda", "cpu") or not torch.is_autocast_enabled(dev):
        return ts
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.device.type == dev and t.is_floating_point() and
                 t.dtype != torch.float64 else t for t in ts)


def _check_arg_types(attn_mask, dropout_p, is_causal, scale, enable_gqa, causal, causal_alignment, return_lse,
                     kernel, num_splits, window):
    # The argument checks that the binding's parse_args makes in eager calls,
    # with its messages, made here for the op path: the op's schema below would
    # coerce some (is_causal=2 to True) and refuse others in its own words
    # (kernel=1). Returns dropout_p and scale as Python floats and num_splits
    # as a Python int or None (the schema takes no numpy scalar), and window
    # as the op's list of two ints (-1: no bound) or None. Their values (kernel="nope", a mask tensor, a window's
    # sides), and the tensors, are checked when the op runs.
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask: expected None or a tensor, got {type(attn_mask).__name__}; pass a bool mask "
                        f"(True: the key is seen) or a float one added to the scores")
    for name, val, table in (("causal_alignment", causal_alignment, CAUSAL_ALIGNMENTS), ("kernel", kernel, KERNELS)):
        if not isinstance(val, str):
            raise ValueError(f"{name}: expected one of {', '.join(map(repr, table))}, got {val!r}")
    for name, val in (("is_causal", is_causal), ("enable_gqa", enable_gqa), ("return_lse", return_lse)):
        if not isinstance(val, bool):
            raise TypeError(f"{name}: expected a bool, got {type(val).__name__}; pass True or False")
    if causal is not None and not isinstance(causal, bool):
        raise TypeError(f"causal: expected None or a bool, got {type(causal).__name__}; pass True or False")
    if num_splits is not None:  # (an int as the binding takes it: anything with __index__)
        num_splits = _index_arg(num_splits, "num_splits",
                                lambda: f"num_splits: expected None or an int, got {type(num_splits).__name__}")
        # (the binding's range, before the op's schema could word it; while torch.compile traces, the op's
        # run refuses it, as it refuses other values)
        if not torch.compiler.is_compiling() and not 0 <= num_splits <= 2 ** 31 - 1:
            raise ValueError(f"num_splits: got {num_splits}; pass None or 0 (heuristic), 1 (no split) or n > 1 "
                             f"(split Sk n ways)")
    if window is not None:  # (binding.cpp's window_side, in Python: dynamo cannot trace a call into the binding)
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"window: expected None or a pair (left, right) of keys before and after the diagonal, "
                            f"got {window!r}")
        sides = []
        for side, n in zip(("left", "right"), window):  # (ints as the binding takes them: anything with __index__)
            sides.append(-1 if n is None else _index_arg(
                n, f"window: {side}",
                lambda: f"window: {side} is {type(n).__name__}; pass an int >= 0 (keys), or None for no bound"))
            if not -1 <= sides[-1] <= 2 ** 31 - 1:  # (the op's list could not carry every int)
                raise ValueError(f"window: {side} = {sides[-1]}; pass an int from 0 to 2^31-1 (keys), or None "
                                 f"(or -1) for no bound")
        window = sides
    floats = []
    for name, val, fix in (("dropout_p", dropout_p, "pass 0.0"),
                           ("scale", scale, "pass None for 1/sqrt(D) or a float > 0")):
        if name == "scale" and val is None:
            floats.append(None)
            continue
        if (isinstance(val, (bool, str, bytes, complex, torch.Tensor)) or _is_numpy_bool(val)
                or not (isinstance(val, (int, float)) or hasattr(val, "__float__"))):
            raise TypeError(f"{name}: expected a float, got {'numpy.' if _is_numpy_bool(val) else ''}"
                            f"{type(val).__name__}; {fix}")
        try:
            floats.append(float(val))
        except OverflowError:
            raise ValueError(f"{name}: {val!r} is out of range; {fix}") from None
    return (*floats, num_splits, window)


def _is_numpy_bool(val):
    # binding.cpp's float_arg refuses a numpy bool as it refuses a Python bool (numpy 2 names the type
    # numpy.bool, numpy 1 numpy.bool_)
    return type(val).__module__ == "numpy" and type(val).__name__ in ("bool", "bool_")


def _index_arg(n, name, not_int):
    # binding.cpp's type check and index_arg: n (not a bool or a tensor) as a Python int through
    # __index__, or a TypeError naming the argument: not_int() where n's type has no __index__, else the
    # error its __index__ raised, chained. The type is read only once the conversion has failed (dynamo
    # traces operator.index of a numpy int, not a hasattr on its type).
    if isinstance(n, (bool, torch.Tensor)):
        raise TypeError(not_int())
    try:
        return operator.index(n)
    except Exception as e:
        if not hasattr(type(n), "__index__"):
            raise TypeError(not_int()) from None
        raise TypeError(f"{name}: {type(n).__name__} does not convert to an int; pass an int") from e


@torch.library.custom_op("flashcore::attention", mutates_args=())
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: Optional[torch.Tensor], dropout_p: float, is_causal: bool,
                  scale: Optional[float], causal: Optional[bool], causal_alignment: str,
                  return_lse: bool, kernel: str, num_splits: Optional[int],
                  window: Optional[List[int]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """flashcore.attention as a torch.library op: (out, lse), lse of shape (0,) unless return_lse."""
    # A __torch_function__ subclass reaches the implementation as itself (its
    # handler ran the op with torch functions off); its data is a plain tensor's.
    query, key, value = (t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
                         for t in (query, key, value))
    _refuse_not_one_call(query, key, value)
    with torch.no_grad():  # (the autograd formula below records the call, not the binding)
        r = _C.attention(query, key, value, attn_mask, dropout_p, is_causal, scale, False, causal,
                         causal_alignment, return_lse, kernel, num_splits, window)
    if r is NotImplemented and (query.shape[3] % 8 != 0 or (scale is not None and scale <= 0)):
        # (flashcore.attention pads such a head dim and flips such a scale)
        _C.check_call(query, key, value, attn_mask, dropout_p, is_causal, scale, causal, causal_alignment,
                      return_lse, kernel, num_splits, window, True)  # (raises the binding's message)
    if r is NotImplemented and value.shape[3] != query.shape[3]:
        _refuse_own_dv(query, value)
    if r is NotImplemented:
        raise RuntimeError("flashcore: internal error: the custom op's implementation got tensors without storage")
    if return_lse:
        return r
    return r, query.new_empty((0,), dtype=_lse_dtype(query))


def _lse_dtype(query):
    # binding.cpp's lse_dtype: the LSE is fp64 for fp64 inputs (the CPU path's), else fp32
    return torch.float64 if query.dtype == torch.float64 else torch.float32


def _refuse_not_one_call(query, key, value, traced=False):
    if not _one_call(query, key, value, any_dv=True, traced=traced):
        raise ValueError(f"q, k, v: the op takes one (B, H, S, D) call, got shapes {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}; call flashcore.attention, which takes "
                         f"SDPA's other shapes")


def _refuse_own_dv(query, value):
    raise ValueError(f"v: head dim {value.shape[3]} differs from q's {query.shape[3]}, which the op runs only "
                     f"where the kernel takes v's own head dim (a multiple of 8 below D, on the CPU or on the "
                     f"sm90 kernel at D > 128); call flashcore.attention, which pads v for the others")


@_attention_op.register_fake
def _attention_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, causal, causal_alignment,
                    return_lse, kernel, num_splits, window=None):
    # The shapes the binding allocates: out like q (contiguous), lse (B, Hq, Sq)
    # fp32 (fp64 for fp64 inputs). While torch.export traces (and for direct fake-tensor calls, and
    # meta tensors: the op's meta kernel), the binding's checks that need no
    # data and no GPU (_C.check_call) refuse a bad call with the eager message,
    # so an exported program cannot hold one.
    # Symbolic sizes are checked at the traced example's values; the op's own
    # checks at run time cover the rest (the kernel's refusals among them).
    # Not under torch.compile (a tracing context, or the compiling flag, which
    # torch 2.11 leaves off in the fake calls): there dynamo would turn the
    # message into its own RuntimeError, while the op's run-time check raises
    # it as it is.
    compiling = torch.compiler.is_compiling() or TracingContext.try_get() is not None
    if torch.compiler.is_exporting() or not compiling:
        ts, sizes = _at_hints(_autocast(query, key, value))
        if sizes and not _one_call(*ts, any_dv=True):
            # (sizes that differ at the example's values, independent batch dims among them: the eager
            # call's refusal of shapes that do not broadcast, else the op's of another call)
            _as_bhsd(*ts, scale)
        _refuse_not_one_call(*ts, traced=True)
        if not _C.check_call(*ts, _mask_at_hints(attn_mask), dropout_p, is_causal, scale, causal, causal_alignment,
                             return_lse, kernel, num_splits, window, sizes):
            _refuse_own_dv(query, value)
    out = query.new_empty((*query.shape[:3], value.shape[3]))  # (B, Hq, Sq, Dv)
    lse = query.new_empty(tuple(query.shape[:3]) if return_lse else (0,), dtype=_lse_dtype(query))
    return out, lse


def _hint(d):
    # a size as an int: itself, or a symbolic size's value in the traced example (None for none: unbacked)
    x = d if type(d) is int else getattr(d.node, "hint", None)
    return x if type(x) is int else None


def _mask_at_hints(mask):
    # attn_mask for _C.check_call, as _at_hints gives q, k and v: itself where its sizes are ints, else a
    # stand-in of its dtype and device at its sizes' hints (reading a symbolic size would guard on it,
    # which fails an export whose mask has a dynamic dim), or of ones where a size has no hint (the op's
    # run checks it).
    if not isinstance(mask, torch.Tensor) or all(type(d) is int for d in mask.shape):
        return mask
    sizes = [_hint(d) for d in mask.shape]
    return mask.new_empty([1] * mask.dim() if None in sizes else sizes)


def _at_hints(ts):
    # Fake q, k and v whose sizes and strides the binding can read (ints), for
    # _C.check_call: the tensors themselves where all are concrete, otherwise
    # fresh ones of the same dtype and device with each symbolic size at its
    # value in the traced example (its hint). A size with no such value
    # (unbacked: data-dependent) takes one no check refuses by: a sequence
    # length (q's 1; k's or v's the other's, the one check_inputs compares it
    # with) or a stride of dims 0-2 (1; only the last dim's is read). Returns
    # (tensors, True), or (ts, False) where another size has no value
    # (check_call then reads no size or stride).
    if all(type(d) is int for t in ts for d in (*t.shape, *t.stride())):
        return ts, True
    sizes = [[_hint(d) for d in t.shape] for t in ts]
    strides = [[_hint(d) for d in t.stride()] for t in ts]
    (q, k, v) = sizes
    q[2] = 1 if q[2] is None else q[2]
    k[2] = k[2] if k[2] is not None else v[2] if v[2] is not None else 1
    v[2] = k[2] if v[2] is None else v[2]
    for st in strides:
        st[:3] = [1 if x is None else x for x in st[:3]]
    if any(x is None for dims in sizes + strides for x in dims):
        return ts, False
    return [t.new_empty_strided(n, st) for t, n, st in zip(ts, sizes, strides)], True


@_attention_op.register_vmap
def _attention_vmap(info, in_dims, query, key, value, attn_mask, dropout_p, is_causal, scale, causal,
                    causal_alignment, return_lse, kernel, num_splits, window=None):
    # torch.vmap's batching rule: one call for all N samples, in place of
    # torch's fallback of one call per sample. A sample's query rows never see
    # another sample's keys, so folding the samples into one call is exact:
    # - k and v not vmapped (q alone): the samples become query heads, head
    #   h * N + n, which reads KV head (h * N + n) / (N * Hq / Hkv) = h / (Hq / Hkv),
    #   the one sample n's head h reads; k and v are read in place.
    # - otherwise the samples fold into B: (N, B, H, S, D) -> (N * B, H, S, D).
    # A tensor that does not fold as a view (an unbatched one is expanded to N)
    # is copied. What an unbatched call would refuse is refused by sample 0's
    # own call, so the message names per-sample shapes.
    n = info.batch_size
    if attn_mask is not None:
        raise ValueError("attn_mask: not taken under torch.vmap so far; call flashcore.attention per sample, or "
                         "fold the samples into the batch dim with the mask broadcast to match")
    args = (dropout_p, is_causal, scale, causal, causal_alignment, return_lse, kernel, num_splits, window)
    ts = [t.movedim(d, 0) if d is not None else t.expand(n, *t.shape) for t, d in zip((query, key, value), in_dims)]
    _refuse_transforms(*ts)  # (a transform below this vmap level, e.g. grad(vmap(f)))
    error = None
    if attn_mask is None and all(t.dim() == 5 and t.stride(-1) == 1 for t in ts):
        B, H = ts[0].shape[1], ts[0].shape[2]
        try:
            if in_dims[1] is None and in_dims[2] is None:
                q = ts[0].permute(1, 2, 0, 3, 4).reshape(B, H * n, *ts[0].shape[3:])  # (B, H * N, Sq, D)
                out, lse = _attention_op(q, key, value, None, *args)
                out = out.unflatten(1, (H, n)).permute(2, 0, 1, 3, 4)
                lse = lse.unflatten(1, (H, n)).permute(2, 0, 1, 3) if return_lse else lse
            else:
                out, lse = _attention_op(*(t.flatten(0, 1) for t in ts), None, *args)
                out = out.unflatten(0, (n, B))
                lse = lse.unflatten(0, (n, B)) if return_lse else lse
            return (out, lse), (0, 0 if return_lse else None)
        except (ValueError, TypeError) as e:
            error = e  # raised below unless sample 0's own call refuses first
    mask0 = attn_mask if in_dims[3] is None else attn_mask.select(in_dims[3], 0)
    _attention_op(ts[0][0], ts[1][0], ts[2][0], mask0, *args)
    if error is not None:
        raise error  # a refusal only the folded call meets
    raise RuntimeError("flashcore: internal error: vmap's batching rule found a call it cannot fold that "
                       "sample 0 runs")


# ---- backward ----
#
# The op's autograd formula: the forward saves q, k, v, out and lse (the op
# returns lse whenever grad is needed, see attention), and the backward op
# runs fc_attn_bwd (the CPU path, or a GPU kernel: the forward's `kernel`
# picks the family, "auto" the Hopper one on H100/H200 and the portable one
# elsewhere).
# The gradient of lse, when the caller used it, enters as dlse.

def _attention_setup_context(ctx, inputs, output):
    (query, key, value, attn_mask, dropout_p, is_causal, scale, causal, causal_alignment, _, kernel, num_splits,
     window) = inputs
    out, lse = output
    ctx.scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    # (the forward ran, so the arguments are valid; the binding's own reading of them)
    ctx.causal_mode, ctx.window = _C.causal_window(is_causal if causal is None else causal, causal_alignment, window)
    # (a direct op call without return_lse leaves lse empty: the backward recomputes it)
    ctx.set_materialize_grads(False)  # an unused lse (or out) gradient comes as None, not zeros
    ctx.forward_args = (dropout_p, is_causal, scale, causal, causal_alignment, True, kernel, num_splits, window)
    ctx.kernel = kernel  # the backward runs the same family
    # (the mask with the tensors: an in-place change of it before backward() is then an error, not a wrong
    # gradient)
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)


def _attention_backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    if grad_out is None:  # (only lse was used)
        grad_out = torch.zeros_like(out)
    if lse.dim() != 3:
        out, lse = _attention_op(query, key, value, attn_mask, *ctx.forward_args)
    dlse = grad_lse if grad_lse is not None and grad_lse.dim() == 3 else None
    det = torch.are_deterministic_algorithms_enabled()  # on: dQ summed in a fixed order
    window = None if ctx.window is None else list(ctx.window)
    # v's own head dim Dv < D (_own_dv_op's forward): the backward takes it as it is where its kernel does
    # (_C.native_dv_bwd: the CPU path, the sm90 kernel at D > 128), else runs at D with v, out and grad_out
    # padded by zero columns, which is exact (their products with the pads are 0; dv's pad columns are cut off).
    dv_cols = value.shape[3]
    if dv_cols != query.shape[3] and not _native_dv_bwd(query, key, value, ctx, det, window):
        value, out, grad_out = (_pad_cols(t, query.shape[3]) for t in (value, out, grad_out))
    dq, dk, dv = _attention_backward_op(grad_out, query, key, value, out, lse, dlse, ctx.scale, ctx.causal_mode,
                                        ctx.kernel, det, window, attn_mask)
    return (dq, dk, dv if dv.shape[-1] == dv_cols else dv[..., :dv_cols]) + (None,) * 10


def _pad_cols(t, d):
    # t with zero columns appended up to d, or t where it has d (v's own head dim padded: _pad_head_dims'
    # q, k and v, the backward's v, out and grad_out).
    return torch.nn.functional.pad(t, (0, d - t.shape[-1])) if t.shape[-1] < d else t


def _native_dv_bwd(query, key, value, ctx, det, window):
    # Whether the backward runs with v's own head dim (_C.native_dv_bwd); never while torch.compile traces
    # (fake tensors have no data to check; the padded backward is traced) nor for wrapper tensors.
    if not _plain_eager((query, key, value)):
        return False
    return bool(_C.native_dv_bwd(query, key, value, ctx.causal_mode, KERNELS[ctx.kernel], det, window))


@torch.library.custom_op("flashcore::attention_backward", mutates_args=())
def _attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, grad_lse: Optional[torch.Tensor], scale: float,
                           causal_mode: int, family: str = "auto", deterministic: bool = False,
                           window: Optional[List[int]] = None,
                           attn_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of flashcore::attention: (dq, dk, dv), contiguous, in q's dtype, on the
    forward's kernel family (``family``: the forward's ``kernel``, as flashcore.attention takes it;
    not named ``kernel``, which inductor's fallback passes as a keyword of its own).
    ``deterministic`` (the autograd formula passes torch.are_deterministic_algorithms_enabled()):
    dq summed in a fixed order on CUDA (both GPU backward kernels). ``window``: the forward's
    sliding window as the C API takes it, [window_left, window_right] (-1: no bound), or None. ``attn_mask``: the
    forward's mask (the CPU path's so far), or None."""
    if family not in KERNELS:
        raise ValueError(f"family: expected one of {sorted(KERNELS)}, got {family!r}")
    ts = [t.as_subclass(torch.Tensor) if t is not None and type(t) is not torch.Tensor else t
          for t in (grad_out, query, key, value, out, lse, grad_lse, attn_mask)]
    return _C.bwd(*ts[:7], scale, causal_mode, KERNELS[family], deterministic, window, ts[7])


@_attention_backward_op.register_fake
def _attention_backward_fake(grad_out, query, key, value, out, lse, grad_lse, scale, causal_mode, family="auto",
                             deterministic=False, window=None, attn_mask=None):
    # (the LSE's dtype as the binding's bwd checks it, so a traced call refuses what the run would; its
    # shapes are the run's to check: comparing symbolic sizes here would guard on them)
    for name, t in (("lse", lse), ("dlse", grad_lse)):
        if t is not None and t.dtype != _lse_dtype(query):
            raise ValueError(f"{name}: expected a {str(_lse_dtype(query)).removeprefix('torch.')} tensor for "
                             f"{str(query.dtype).removeprefix('torch.')} inputs, got {t.dtype}")
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (query, key, value))


@_attention_backward_op.register_vmap
def _attention_backward_vmap(info, in_dims, grad_out, query, key, value, out, lse, grad_lse, scale, causal_mode,
                             family="auto", deterministic=False, window=None, attn_mask=None):
    # torch.vmap's batching rule for the backward (batched gradients: gradcheck's check_batched_grad,
    # autograd.grad(is_grads_batched=True), jacobians with vectorize=True): the N samples fold into B,
    # an unbatched tensor expanded to N first (copied by the fold), one call for all of them. Samples
    # never meet in the sums (dK and dV sum over a KV head's query heads within a batch entry), so the
    # fold is exact.
    n = info.batch_size

    def fold(t, d):
        if t is None:
            return None
        t = t.movedim(d, 0) if d is not None else t.expand(n, *t.shape)
        t = t.flatten(0, 1)
        return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()  # (the binding's last-dim rule)
    mask = None
    if attn_mask is not None:  # (the forward's mask, broadcast to its (B, Hq, Sq, Sk), then to the N samples)
        if in_dims[-1] is not None:
            raise ValueError("attn_mask: a mask batched by torch.vmap is not taken so far; compute the batched "
                             "gradients of a mask shared by the samples, or one sample at a time")
        per_sample = [t.shape if d is None else t.movedim(d, 0).shape[1:] for t, d in ((query, in_dims[1]),
                                                                                     (key, in_dims[2]))]
        mask = fold(attn_mask.expand(*per_sample[0][:3], per_sample[1][2]), None)
    ts = [fold(t, d) for t, d in zip((grad_out, query, key, value, out, lse, grad_lse), in_dims)]
    dq, dk, dv = _attention_backward_op(*ts, scale, causal_mode, family, deterministic, window, mask)
    return tuple(g.unflatten(0, (n, -1)) for g in (dq, dk, dv)), (0, 0, 0)


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup_context)


# ---- FLOP counts (torch.utils.flop_counter.FlopCounterMode) ----
#
# As torch counts its fused SDPA kernels, so that a model's count does not
# change when flashcore replaces SDPA: the two matmuls of each query head,
# causal masks and windows not subtracted; the backward counts the recomputed
# scores and four more matmuls. (An eager call under the mode runs the op.)

@register_flop_formula(torch.ops.flashcore.attention)
def _attention_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    b, hq, sq, d = query_shape
    dv = value_shape[3]
    return 2 * b * hq * sq * key_shape[2] * (d + dv)  # S = Q K^T, O = P V


@register_flop_formula(torch.ops.flashcore.attention_backward)
def _attention_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    b, hq, sq, d = query_shape
    dv = value_shape[3]
    return 2 * b * hq * sq * key_shape[2] * (3 * d + 2 * dv)  # S again, dP, dV (Dv); dQ, dK (D)
