"""Why does contrib-gqa fail on ORT CUDA? One GroupQueryAttention node, its seqlens_k / total
computed several ways (or fed), outputs total/seqlens echoed; compared with a numpy reference."""
import sys
import numpy as np
import onnx
from onnx import TensorProto as TP, helper as h

B, T, N, KV, H, S = 2, 7, 4, 2, 64, 32
PROVIDER = sys.argv[1] if len(sys.argv) > 1 else "cuda"


def graph(total_how: str, cache: bool, dtype=TP.FLOAT16):
    nodes, inits = [], [h.make_tensor("zero_1d", TP.INT64, [1], [0]),
                        h.make_tensor("one_1d", TP.INT64, [1], [1]),
                        h.make_tensor("axis0", TP.INT64, [1], [0])]
    ins = [h.make_tensor_value_info(n, dtype, ["B", "T", d]) for n, d in
           (("q", N * H), ("k", KV * H), ("v", KV * H))]
    if cache:
        ins += [h.make_tensor_value_info(n, dtype, ["B", KV, S, H]) for n in ("past_key", "past_value")]
        ins.append(h.make_tensor_value_info("past_lengths", TP.INT64, ["B"]))
    if total_how == "fed":
        ins += [h.make_tensor_value_info("seqlens", TP.INT32, ["B"]),
                h.make_tensor_value_info("total", TP.INT32, [])]
    else:
        nodes.append(h.make_node("Shape", ["q"], ["t"], start=1, end=2))
        if cache:
            starts = "past_lengths"
        else:
            nodes += [h.make_node("Shape", ["q"], ["b"], start=0, end=1),
                      h.make_node("Expand", ["zero_1d", "b"], ["starts"])]
            starts = "starts"
        nodes += [h.make_node("Add", [starts, "t"], ["ends"]),
                  h.make_node("Sub", ["ends", "one_1d"], ["last"]),
                  h.make_node("Cast", ["last"], ["seqlens"], to=TP.INT32)]
        if total_how == "reducemax":
            nodes += [h.make_node("ReduceMax", [starts], ["mx"], keepdims=0),
                      h.make_node("Squeeze", ["t", "axis0"], ["ts"]),
                      h.make_node("Add", ["mx", "ts"], ["tot64"]),
                      h.make_node("Cast", ["tot64"], ["total"], to=TP.INT32)]
        elif total_how == "shape-where":  # cache: S where T == 1 or B == 1, else T; shapes only
            nodes += [h.make_node("Shape", ["past_key"], ["s"], start=2, end=3),
                      h.make_node("Shape", ["q"], ["bb"], start=0, end=1),
                      h.make_node("Equal", ["t", "one_1d"], ["t1"]),
                      h.make_node("Equal", ["bb", "one_1d"], ["b1"]),
                      h.make_node("Or", ["t1", "b1"], ["use_s"]),
                      h.make_node("Where", ["use_s", "s", "t"], ["tot1"]),
                      h.make_node("Squeeze", ["tot1", "axis0"], ["ts"]),
                      h.make_node("Cast", ["ts"], ["total"], to=TP.INT32)]
        elif total_how == "shape":  # no cache only: total = T
            nodes += [h.make_node("Squeeze", ["t", "axis0"], ["ts"]),
                      h.make_node("Cast", ["ts"], ["total"], to=TP.INT32)]
        elif total_how == "reducemax-seqlens":  # total = max(seqlens) + 1, from the int32 vector
            nodes += [h.make_node("ReduceMax", ["seqlens"], ["mx"], keepdims=0),
                      h.make_node("Add", ["mx", "one32"], ["total"])]
            inits.append(h.make_tensor("one32", TP.INT32, [], [1]))
    cache_in = ["past_key", "past_value"] if cache else ["", ""]
    nodes.append(h.make_node("GroupQueryAttention", ["q", "k", "v", *cache_in, "seqlens", "total"],
                             ["y", "present_key", "present_value"], domain="com.microsoft",
                             num_heads=N, kv_num_heads=KV))
    nodes += [h.make_node("Identity", ["total"], ["total_out"]),
              h.make_node("Identity", ["seqlens"], ["seqlens_out"])]
    outs = [h.make_tensor_value_info("y", dtype, None),
            h.make_tensor_value_info("total_out", TP.INT32, None),
            h.make_tensor_value_info("seqlens_out", TP.INT32, None)]
    if cache:
        outs += [h.make_tensor_value_info(n, dtype, None) for n in ("present_key", "present_value")]
    m = h.make_model(h.make_graph(nodes, "gqa", ins, outs, inits),
                     opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def reference(q, k, v, pk, pv, past, T):
    """numpy: cache rows past..past+T-1 written, causal attention over 0..past+T-1."""
    q = q.astype(np.float64).reshape(B, T, N, H).transpose(0, 2, 1, 3)
    k = k.astype(np.float64).reshape(B, T, KV, H).transpose(0, 2, 1, 3)
    v = v.astype(np.float64).reshape(B, T, KV, H).transpose(0, 2, 1, 3)
    y = np.zeros((B, N, T, H))
    for b in range(B):
        p = past[b]
        K = np.concatenate([pk[b, :, :p].astype(np.float64), k[b]], 1) if pk is not None else k[b]
        V = np.concatenate([pv[b, :, :p].astype(np.float64), v[b]], 1) if pv is not None else v[b]
        for n in range(N):
            s = q[b, n] @ K[n // (N // KV)].T / np.sqrt(H)
            mask = np.arange(p + T)[None, :] > (p + np.arange(T))[:, None]
            s[mask] = -np.inf
            w = np.exp(s - s.max(1, keepdims=True)); w /= w.sum(1, keepdims=True)
            y[b, n] = w @ V[n // (N // KV)]
    return y.transpose(0, 2, 1, 3).reshape(B, T, N * H)


def run(total_how, cache, bind, dtype_np=np.float16, dtype=TP.FLOAT16, chunk=False):
    import onnxruntime as ort
    global B
    B = 1 if chunk else 2
    T = (3 if chunk else 1) if cache else 7  # ORT: T > 1 over a cache needs B = 1
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, d)).astype(dtype_np) for d in (N * H, KV * H, KV * H))
    past = np.array([5, 9][:B] if cache else [0] * B)
    feeds = {"q": q, "k": k, "v": v}
    pk = pv = None
    if cache:
        pk = rng.standard_normal((B, KV, S, H)).astype(dtype_np)
        pv = rng.standard_normal((B, KV, S, H)).astype(dtype_np)
        feeds.update(past_key=pk.copy(), past_value=pv.copy(), past_lengths=past.astype(np.int64))
    if total_how == "fed":
        feeds.update(seqlens=(past + T - 1).astype(np.int32), total=np.array(past.max() + T, np.int32))
    prov = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[PROVIDER]
    so = ort.SessionOptions(); so.log_severity_level = 3
    s = ort.InferenceSession(graph(total_how, cache, dtype), so, providers=[prov])
    want = reference(q, k, v, pk, pv, past, T)
    try:
        if bind and cache:
            dev = "cuda" if PROVIDER == "cuda" else "cpu"
            buf = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n], dev, 0) for n in ("past_key", "past_value")}
            io = s.io_binding()
            for n, x in feeds.items():
                io.bind_ortvalue_input(n, buf[n]) if n in buf else io.bind_cpu_input(n, x)
            for n in ("y", "total_out", "seqlens_out"):
                io.bind_output(n, "cpu")
            io.bind_ortvalue_output("present_key", buf["past_key"])
            io.bind_ortvalue_output("present_value", buf["past_value"])
            s.run_with_iobinding(io)
            y, tot, sl = [o.numpy() for o in io.get_outputs()[:3]]
        else:
            y, tot, sl = s.run(["y", "total_out", "seqlens_out"], feeds)
        err = np.abs(y.astype(np.float64) - want).max()
        print(f"{PROVIDER} {np.dtype(dtype_np).name} cache={cache} chunk={chunk} bind={bind} total={total_how:18s} "
              f"total={tot} seqlens={sl} max|y-ref|={err:.2e}")
    except Exception as e:
        print(f"{PROVIDER} {np.dtype(dtype_np).name} cache={cache} bind={bind} total={total_how:18s} ERROR {str(e)[-220:]}")


if PROVIDER == "cuda":
    import torch  # loads CUDA 13 libraries
for bind in (False, True):
    for chunk in (False, True):
        run("shape-where", True, bind, chunk=chunk)
for cache in (False, True):
    for how in ("reducemax", "fed", "reducemax-seqlens") + (("shape",) if not cache else ()):
        for bind in ((False, True) if cache else (False,)):
            run(how, cache, bind)
run("reducemax", False, False, np.float32, TP.FLOAT)
run("fed", False, False, np.float32, TP.FLOAT)
