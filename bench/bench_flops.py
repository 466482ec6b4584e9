"""Cost-table throughput: vectorised ``cost_table`` against a per-row ``request_flops`` loop (baseline).

Run: ``.venv/bin/python bench/bench_flops.py [--rows 1000000]``. The baseline is timed on a 20,000-row
slice and scaled per row; both produce the same numbers (checked on the slice). Also prints, for
Qwen2.5-1.5B, the analytic and RACE per-token costs that the two FLOP conventions assign.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from isocompute.flops import (
    RaceConvention,
    decode_flops,
    load_model_flops,
    lora_update_flops,
    prefill_flops,
    request_flops,
)
from isocompute.solver.costs import cost_table

QWEN25_15B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536,
              "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
ACTIONS = [1, 2, 4, 8, 16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = load_model_flops(QWEN25_15B)
    rng = np.random.default_rng(args.seed)
    p = rng.integers(20, 600, args.rows)
    m = rng.integers(50, 2_000, args.rows).astype(np.float64)

    t0 = time.perf_counter()
    c = cost_table(p, m, ACTIONS, unit="flops", model=model)
    t_vec = time.perf_counter() - t0

    sl = min(20_000, args.rows)
    t0 = time.perf_counter()
    loop = np.array([[request_flops(model, int(p[i]), [int(m[i])] * k) for k in ACTIONS] for i in range(sl)])
    t_loop = (time.perf_counter() - t0) * args.rows / sl
    assert np.allclose(loop, c[:sl], rtol=1e-12)
    print(f"cost_table {args.rows:,} rows × {len(ACTIONS)} actions: {t_vec:.3f} s vectorised, "
          f"{t_loop:.1f} s per-row loop (est.), speed-up ×{t_loop / t_vec:,.0f}")

    n, nm = model.n_params, model.matmul_params
    conv = RaceConvention()
    print(f"Qwen2.5-1.5B: N = {n:,}, N_matmul = {nm:,} (head {model.head_params:,})")
    for ctx in (128, 1_024, 4_096):
        per_tok = float(decode_flops(model, ctx, 2) / 1)
        print(f"  decode step @ ctx {ctx + 1:>5}: analytic {per_tok:.3e} FLOPs/token vs RACE c_fwd·N {conv.c_fwd * n:.3e} "
              f"(ratio {per_tok / (conv.c_fwd * n):.3f})")
    print(f"  prefill 512 tokens: analytic {prefill_flops(model, 512):.3e} vs RACE {conv.rollout(n, 512):.3e}")
    n_lora = model.lora_params(16)
    ana = float(lora_update_flops(model, 1_024, n_lora))
    race = conv.update(n, 1_024, n_lora)
    print(f"  LoRA r16 update, 1024-token sequence: analytic {ana:.3e} vs RACE {race:.3e} "
          f"(ratio RACE/analytic {race / ana:.3f})")


if __name__ == "__main__":
    main()
