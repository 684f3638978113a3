"""The decoding step's matrix products in ``dsh bench --parts tiny``: their rate inside the engine's steps against
the best library rate at the same shapes measured alone.

Inside: the engine's CPU path (float16 KV cache where the CPU has half floats) samples the sampling part's prompts with
:meth:`dsh.llm.engine.Engine.log_products` on; the products of the steps that ran with every slot busy (the step's
shape: ``rows`` rows) are summed, FLOPs over seconds, each product timed around its call (so a thread pool's wake-up
and caches emptied by the attention count, as they do in a step; where the step runs in parts of the rows, a thread
each, :mod:`dsh.llm.kernel_engine`, each product's time is its threads' mean, as they take their parts at once).
Alone: each of those products (every layer's fused q/k/v, output, fused gate/up and down projections and the LM head)
at ``rows`` rows, timed many times over by torch's product (MKL on x86), by oneDNN with the weight packed ahead and by
MKL with the weight packed ahead (the product the step in C takes where it gives torch's bits, :mod:`dsh.llm.blas`),
the fastest per shape making the best library rate (:func:`library_rates`), and by the step's own panel product where
it gives torch's bits (the fastest of all making the serial bound's rate). The share of the first in the best library
rate is README "Performance"'s "products in the step" figure. The same run times the attention inside the step
(:meth:`dsh.llm.engine.Engine.log_products`' ``attention``): its cache bytes/s in the full steps (:mod:`.compare` puts
them against the run's read bandwidth; :mod:`.attention` times the attention alone), and the shares of the run's time
that the steps' products and attention took; the rest is the step's other work (norms, SwiGLU, sampling), the threads'
waits and the host's Python between the steps.
"""

from __future__ import annotations

import os
import time

from ...llm import kernels
from ...llm.models import load
from ...llm.peaks import best_seconds, onednn_available
from ...training.laptop_base import SHIPPED_BASE


def _step_weights(model) -> tuple:
    """One decoder layer's product weights as the engine runs them (fused q/k/v, output, fused gate/up, down), the
    LM head's, and the number of layers."""
    from ...llm.kernel_engine import fused_projections  # imports torch: only when the bench runs

    layer = model.model.layers[0]
    (qkv, _), (gate_up, _) = fused_projections(layer)
    w = [qkv, layer.self_attn.o_proj.weight.detach(), gate_up, layer.mlp.down_proj.weight.detach()]
    return w, model.lm_head.weight.detach(), len(model.model.layers)


def library_rates(model, rows: int, repeats: int = 20, calls: int = 20) -> dict:
    """FLOP/s of one decoding step's products at ``rows`` rows measured alone (:func:`_step_weights`, fastest of
    ``repeats`` runs of ``calls`` calls each): ``mkl_flops`` (torch's product for every shape), ``onednn_flops``
    (oneDNN, weights packed ahead; absent where torch has none), ``mkl_packed_flops`` (MKL, weights packed ahead,
    into a kept output; absent where torch's library exports no MKL packing), ``best_flops`` (the fastest library per
    shape), ``panel_flops`` (the step's own panel product, :func:`dsh.llm.kernels.panel_product`, at the chunk that
    gives torch's bits, :func:`dsh.llm.products.panels_agree`, on the shapes where one does, the library's product on
    the others; absent where the kernels have none) and ``fastest_flops`` (the fastest of all per shape: the serial
    bound's product rate)."""
    import torch

    from ...llm import blas, products

    F = torch.nn.functional
    w, head, n_layers = _step_weights(model)
    g = torch.Generator().manual_seed(0)
    shapes = w + [head]
    counts = [n_layers] * len(w) + [1]                  # how many times a step runs each product
    flops = sum(2 * rows * x.numel() * c for x, c in zip(shapes, counts))
    times = {"mkl": [], "onednn": [], "mkl_packed": []}
    panels, lib = [], kernels.load()
    ops = torch.ops.mkldnn if onednn_available() else None
    cpu = torch.device("cpu")
    with torch.no_grad():
        for x in shapes:
            a = torch.randn(rows, x.shape[1], generator=g)
            times["mkl"].append(best_seconds(cpu, lambda a=a, x=x: [F.linear(a, x) for _ in range(calls)], repeats) / calls)
            if ops is not None:
                p = ops._reorder_linear_weight(x)
                times["onednn"].append(best_seconds(cpu, lambda a=a, p=p: [ops._linear_pointwise(a, p, None, "none", [], "")
                                                                      for _ in range(calls)], repeats) / calls)
            if blas.packed_addresses() is not None:
                p, o = blas.pack(x, rows), torch.empty(rows, x.shape[0])
                times["mkl_packed"].append(best_seconds(cpu, lambda a=a, p=p, o=o: [blas.packed_product(a, p, o)
                                                                               for _ in range(calls)], repeats) / calls)
            chunk = products.panels_agree("linear", *x.shape, rows, rows) if kernels.has_panels(lib) else 0
            if chunk:
                p, o = kernels.panel_pack(lib, x), torch.empty(rows, x.shape[0])
                panels.append(best_seconds(cpu, lambda a=a, p=p, o=o, c=chunk: [kernels.panel_product(lib, a, p, o, 0.0, c)
                                                                           for _ in range(calls)], repeats) / calls)
            else:
                panels.append(times["mkl"][-1])
    step = {k: sum(t * c for t, c in zip(ts, counts)) for k, ts in times.items() if ts}
    best = [min(ts[i] for ts in times.values() if ts) for i in range(len(counts))]
    out = {**{f"{k}_flops": flops / s for k, s in step.items()}, "best_flops": flops / sum(t * c for t, c in zip(best, counts))}
    if kernels.has_panels(lib):
        out["panel_flops"] = flops / sum(t * c for t, c in zip(panels, counts))
        out["fastest_flops"] = flops / sum(min(b, t) * c for b, t, c in zip(best, panels, counts))
    return out


def in_step_rate(model, tok, prompts, rows: int, max_new: int, seed: int, kv_cache: str) -> dict:
    """The products' FLOP/s inside the engine's CPU-path steps that ran all ``rows`` slots (module docstring), with
    how many such steps there were and the run's tokens/s; the attention's cache bytes/s in those steps (timed around
    its calls in the step, as the products are); and the run's seconds with the shares of them that its steps'
    products took (every step's) and its attention took (the steps taken in C: the Python step logs none)."""
    from ...llm.engine import Engine

    eng = Engine(model, [tok.eos_token_id], slots=rows, max_len=max(map(len, prompts)) + max_new,
                 attention="kernels", kv_cache=kv_cache)
    eng.plan()
    eng.generate(prompts[:rows], 8, seed=seed + 1)                 # warm-up (kernels compiled, products planned)
    log: list = []
    attention: list = []
    eng.log_products(log, attention)
    t = time.perf_counter()
    gens = eng.generate(prompts, max_new, temperature=1.0, seed=seed)
    secs = time.perf_counter() - t
    full = [(f, s) for r, f, s in log if r == rows]
    full_att = [(b, s) for r, b, s in attention if r == rows]
    per_step = 1 + 4 * len(model.model.layers)                  # products a step: 4 a layer and the LM head
    return {"products_flops": sum(f for f, _ in full) / sum(s for _, s in full), "full_steps": len(full) // per_step,
            "steps": len(log) // per_step, "tokens_per_s": sum(len(g.tokens) for g in gens) / secs,
            "attention_bytes_per_s": sum(b for b, _ in full_att) / sum(s for _, s in full_att) if full_att else None,
            "run_s": secs, "products_share_of_run": sum(s for _, _, s in log) / secs,
            "attention_share_of_run": sum(s for _, _, s in attention) / secs}


def product_rows(rows_list, prompts_per_row: int, max_new: int, prompts_of, seed: int = 0,
                 repeats: int = 3) -> list[dict]:
    """For each row count: the products' rate inside the step and alone (:func:`in_step_rate`, :func:`library_rates`)
    ``repeats`` times, alternating, each repeat one row with ``share_of_best_library`` (inside / best alone) and the
    load average; ``prompts_of(tok, n)`` gives the sampling part's prompts."""
    model, tok = load(str(SHIPPED_BASE), device="cpu")
    model.eval()
    kv = "float16" if kernels.half_cache(kernels.load()) else "float32"
    out = []
    for rows in rows_list:
        prompts = prompts_of(tok, rows * prompts_per_row)
        for rep in range(repeats):
            load_1min = os.getloadavg()[0]
            inside = in_step_rate(model, tok, prompts, rows, max_new, seed + rep, kv)
            alone = library_rates(model, rows)
            out.append({"part": "tiny products", "path": f"products in the step, {rows} rows", "rows": rows,
                        "repeat": rep, "kv_cache": kv, **inside, **alone, "load_1min": load_1min,
                        "share_of_best_library": inside["products_flops"] / alone["best_flops"]})
    return out

